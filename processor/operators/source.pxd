# Cython declarations for source.py (issue 37, docs/compiled.md; see base.pxd).
from processor.operators.base cimport Processor
from processor.state.source_changelog cimport apply_table_record


cdef class StreamSource(Processor):
    cdef public object topic, key_serde, value_serde, timestamp_extractor, _read_ahead
    cdef public Py_ssize_t records_in

    cpdef tuple deserialize(self, key_bytes, value_bytes)
    cpdef process_bytes(self, key_bytes, value_bytes, timestamp)


cdef class TableSource(StreamSource):
    cdef public object store_name, store
    cdef public Py_ssize_t noop_updates_skipped

    cpdef process_bytes(self, key_bytes, value_bytes, timestamp)
