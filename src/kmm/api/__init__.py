"""The Module API as pure data: models, validation, names, rendered manifests.

Nothing here performs I/O or imports a client library; every other package may
import it, and it imports none of them.
"""
