"""An emulator of the kubelet's DRA manager, so DRA drivers can be tested
without a node.
"""
