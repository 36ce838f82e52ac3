"""Every bound on what optlayout reads, in one place: file sizes, nesting, and the sizes of models, jobs, layouts and
clusters. Past a bound the input is refused in one line naming the field; nothing is allocated for it first.

The bounds sit far above anything published (the sources are in `optlayout/presets/*.yaml`) and below what would
exhaust memory or time: every count that sizes a loop or an allocation of the search, the topology builders or the
cost model is bounded here. The largest cluster accepted, 2^20 GPUs, takes about 3 GB and a minute to build on a
2-core VM (benchmarks/RESULTS.md, "Bad input"); 131,072 GPUs take seconds.
"""

from __future__ import annotations

MIB = 2**20

# ---------------------------------------------------------------------------------------------- files
MAX_DEPTH = 64  # nesting of JSON/YAML/XML documents; the deepest file optlayout writes or reads has 6 levels
MAX_YAML_NODES = 5_000_000  # nodes of a YAML document after its aliases are expanded (an alias bomb is refused)
MAX_INT_DIGITS = 40  # an integer literal longer than this is no count of anything (2^128 has 39 digits)
MAX_EVENT_BYTES = 64 * MIB  # one torch.profiler event (a name, its args) while a trace is streamed

# ---------------------------------------------------------------------------------------------- clusters
MAX_GPUS = 2**20  # eight times the largest published cluster (its graph: about 3 GB, a minute to build on 2 cores)
MAX_SERVERS = 2**17
MAX_GPUS_PER_SERVER = 4096  # a server (or a custom server graph) of the generator form; GB300 NVL576 racks: 576
MAX_GRAPH_ELEMENTS = 8_000_000  # nodes + edges of a topology graph (2^20 GPUs, 8 per server: about 6.5 million)
MAX_SWITCH_TIERS = 16  # leaf, spine, core ... network tiers of a topology (three in every published fabric)
MIN_LINK_BYTES_PER_S = 1e5  # a link slower than 0.8 Mb/s carries no training traffic
MAX_LINK_BYTES_PER_S = 1e15  # 8 Pb/s: a thousand times NVLink 5
MAX_LATENCY_S = 1.0
MAX_OVERSUBSCRIPTION = 1e4

# ---------------------------------------------------------------------------------------------- models and jobs
MAX_LAYERS = 16_384  # published: 126 (Llama 3.1 405B), 128 (Megatron GPT 1T)
MAX_HIDDEN = 2**20  # published: 25,600 (Megatron GPT 1T)
MAX_FFN = 2**22
MAX_HEADS = 2**14  # published: 160 (Megatron GPT 1T)
MAX_HEAD_DIM = 2**14
MAX_EXPERTS = 2**16  # routed experts per MoE layer; published: 384 (Kimi K2)
MAX_VOCAB = 2**24  # published: 256,000 (Gemma)
MAX_POSITIONS = 2**24
MAX_SEQ_LEN = 2**24  # 16.8M tokens; published: 10M (Llama 4 Scout)
MAX_GLOBAL_BATCH = 2**24  # sequences per step (also bounds micro-batch and accumulation)
MAX_GLOBAL_BATCH_TOKENS = 2**40
MAX_BYTES_PER_PARAM = 1024.0
MAX_TOP = 1000  # layouts a solve returns (each is one more CP-SAT re-solve)

# ---------------------------------------------------------------------------------------------- GPUs
MAX_GPU_MEMORY_BYTES = 2.0**50  # 1 PiB
MAX_PEAK_FLOPS = 1e18  # per GPU; B300 dense FP4: 1.5e16
MAX_MEMORY_BANDWIDTH_BYTES_PER_S = 1e15
MAX_GPU_SMS = 4096  # per GPU; MI300X: 304 compute units, GB300: 160 SMs

# ---------------------------------------------------------------------------------------------- the CP-SAT model
MAX_CPSAT_COEFFICIENT = 2**40  # every coefficient and bound of the model (memory in MiB: 1 EiB)
MAX_CPSAT_SUM = 2**62  # the sum of a constraint's or the objective's coefficients, inside CP-SAT's int64
