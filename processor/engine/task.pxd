# Cython declarations for task.py (issue 37, docs/compiled.md; see processor/operators/base.pxd):
# the compiled build makes Task an extension type whose per-record attributes are struct fields,
# calls its sources' ``process_bytes`` in C, and reads the context's fields directly.
cimport cython

from processor.operators.base cimport ProcessorContext
from processor.operators.source cimport StreamSource


cdef class Task:
    cdef dict __dict__
    cdef public ProcessorContext context
    cdef public object stores, bookkeeping, output_room, internal_topics, _internal_sources
    cdef public object _placement_checks, _check_placement, _check_provenance, _direct, _convergence
    cdef public object _send, _extractors, _stream_punctuators, _record_sends
    cdef public bint _atomic
    cdef public list _journal
    cdef public dict sources, positions
    cdef public Py_ssize_t processed, duplicates_dropped

    @cython.locals(ctx=ProcessorContext, source=StreamSource)
    cpdef process(self, topic, partition, offset, timestamp, key, value, headers=*, event_time=*)
