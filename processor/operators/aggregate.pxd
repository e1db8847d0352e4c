# Cython declarations for aggregate.py (issue 37, docs/compiled.md; see base.pxd): the per-record
# attributes of the grouped aggregations are struct fields; ``__dict__`` (from Processor) keeps
# every other attribute working, and the Python subclasses (windowed, session, sliding) work as before.
from processor.operators.base cimport Processor


cdef class _Aggregate(Processor):
    cdef public object store_name, key_serde, value_serde, emit
    cdef public object store, emitter, _task_store, _time_key
    cdef public Py_ssize_t records_in
    cdef public long long observed_time
    cdef public bint punctuates_stream, punctuates_wall, stores_noops

    cpdef _put(self, kb, raw, new_value, ts)


cdef class TableAggregate(_Aggregate):
    cdef public object initializer, adder, subtractor

    cpdef process(self, key, change, timestamp)


cdef class StreamAggregate(_Aggregate):
    cdef public object initializer, aggregator
    cdef public Py_ssize_t skipped_null

    cpdef process(self, key, value, timestamp)
