"""The operator↔trainer contract: the one place both sides read their shared facts from.

Dependency-free (standard library only) so that the operator image, the trainer image and the tests can all
import it without pulling in each other: ``progress`` is the progress document rank 0 POSTs and the operator
reads. docs/contract.md points here instead of restating it.
"""
