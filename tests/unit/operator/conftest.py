"""Operator unit tests, one sub-directory per concern of ``kmm.operator``.

This directory has no ``__init__.py``, so pytest puts it on ``sys.path`` when
it imports this file: the tests in the sub-directories import
``operator_fixtures`` (and ``test_operator_reconciler``'s ``RecordingWriter``)
by their plain names, as the tests beside it do. Test module basenames stay
unique across the whole ``tests/`` tree for the same reason.
"""
