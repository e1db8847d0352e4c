# Cython declarations for filter.py (issue 37, docs/compiled.md; see base.pxd).
from processor.operators.base cimport Processor


cdef class TableFilterRule:
    cdef public object predicate, negate, step

    cpdef bint passes(self, key, value) except -1


cdef class StreamFilter(Processor):
    cdef public object predicate, negate
    cdef public Py_ssize_t dropped

    cpdef process(self, key, value, timestamp)


cdef class TableFilter(Processor):
    cdef public TableFilterRule rule
    cdef public Py_ssize_t skipped_both_fail

    cpdef process(self, key, change, timestamp)
