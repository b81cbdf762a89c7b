"""The ordered upgrade concern: each node's move from one module version to the next.

``planner`` (pure) walks the operator's two version labels per node by
KMM's action table (kept as data), after the admin's user label, with the
guards that make the order safe; ``step`` names what a node does or waits
for, in the words ``kmm status`` and ``kmm upgrade`` print.

Limits: no I/O and no DaemonSets of its own; it reads the loader's answer
and that of whichever device workload the Module has (device plugin or DRA
driver). Importers use ``from kmm.operator.upgrade import planner as
upgrade_planner``; this package re-exports nothing.
"""
