"""The kmm node driver: owner of the kubelet plugin, its configuration and its
device policies (kernel-module devices first).
"""
