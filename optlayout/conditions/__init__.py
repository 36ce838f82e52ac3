"""Run conditions of a layout on top of the one cost model: failures and checkpoints (goodput) and stragglers.

reliability.py  Young/Daly interval, MTBF, checkpoint cost (the one write formula), effective time
goodput.py      FailureSpec, StorageSpec; a layout's checkpoint bytes, its interval and goodput
stragglers.py   the slowest rank's slowdown applied to a prediction; expected slowdowns at scale
"""
