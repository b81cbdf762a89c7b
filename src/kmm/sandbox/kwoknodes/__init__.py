"""KWOK's nodes: Node objects the KWOK controller keeps Ready, nothing running.

``nodes``: what such a node is (its object, its kernel of our choosing) and
how a fleet of them is made; ``kind``: the sandbox's KWOK nodes behind the
node interface (``nodekinds``). The KWOK controller itself is the control
plane's (``controlplane``): every sandbox runs it, with or without nodes.
"""
