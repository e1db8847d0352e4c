# Cython declarations for base.py (issue 37, docs/compiled.md): the compiled build makes these
# classes extension types whose attributes named here are struct fields (read and written in C by
# the compiled modules that cimport this file); ``__dict__`` keeps every other attribute working,
# and Python subclasses (user processors) work as before. The .py stays the source and the fallback.

cdef class ProcessorContext:
    cdef dict __dict__
    cdef public object task_id, task_partition, _stores, collector, wall_clock, routing, topic_exists
    cdef public object global_stores
    cdef public dict wall_schedules, _origin_topics
    cdef public object stream_time, topic, partition, offset, headers, sequence
    cdef public bint in_record
    cdef public list outbox
    cdef public object sends   # a list, or the backfill's DirectSends
    cdef public object staged_topics
    cdef public object source_value, source_value_bytes, source_value_serde, origin_head, origin_app

    cpdef send(self, topic, key, value, timestamp, headers)


cdef class Processor:
    cdef dict __dict__
    cdef public object name
    cdef public list children
    cdef public ProcessorContext context

    cpdef process(self, key, value, timestamp)
    cpdef forward(self, key, value, timestamp)
