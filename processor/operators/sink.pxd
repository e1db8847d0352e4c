# Cython declarations for sink.py (issue 37, docs/compiled.md; see base.pxd).
from processor.operators.base cimport Processor


cdef class Sink(Processor):
    cdef public object extractor, route_like, topic, key_serde, value_serde
    cdef public bint carries_table, internal, passthrough
    cdef public Py_ssize_t records_out
    cdef public dict _topic_bytes

    cpdef process(self, key, value, timestamp)
