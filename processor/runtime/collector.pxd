# Cython declarations for collector.py (issue 37, docs/compiled.md; see
# processor/operators/base.pxd): the per-record send reads its producer from a struct field.

cdef class KafkaCollector:
    cdef dict __dict__
    cdef public object producer, changelog_producer
    cdef public Py_ssize_t sent

    cpdef send(self, topic, key, value, timestamp, headers, partition=*)
