"""The validation boundary: every file optlayout reads comes in through here.

    readers.py     one FileKind per kind of file (topology, model-config, plan, calibration, runs, log, discovery
                   sources): size limit, UTF-8 decoding, parsing
    files.py       bytes with a size limit, decoding with the offending byte named
    json_doc.py    strict JSON, depth-limited, duplicate keys refused
    yaml_doc.py    safe YAML (libyaml when installed), duplicate keys and alias bombs refused, depth-limited
    xml_doc.py     XML without DTDs or entities, depth-limited; numeric attributes
    numbers.py     strict and finite pydantic field types; numbers written as text
    limits.py      every bound, in one place

Each refusal is an `InputError` of one line naming the file and the field.
"""
