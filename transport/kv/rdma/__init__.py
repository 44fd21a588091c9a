"""The rdma backend: RC queue pairs, one-sided writes with immediate into registered receive pools.

``plane`` speaks the protocol through a small ``Verbs`` interface; ``fake`` implements it in memory
(tests), ``pyverbs_device`` with rdma-core's pyverbs on a real device.
"""
