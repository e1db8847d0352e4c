# Cython declarations for rocksdb.py (issue 37, docs/compiled.md; see processor/operators/base.pxd).

cdef class RocksDBStore:
    cdef dict __dict__
    cdef public object name, journal, _cf, _sorted
    cdef public dict pending

    cpdef get(self, key)
    cpdef put(self, key, value)
    cpdef delete(self, key)
