"""The kmm operator: reconcilers for Modules and the pure object builders they send.

It never imports ``kmm.kubeletplugin``; the node side is a separate process.
"""
