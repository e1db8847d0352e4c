# Cython declarations for source_changelog.py (issue 37, docs/compiled.md): the table source's
# update rule is a C call from the compiled source (processor/operators/source.pxd cimports it).

cpdef object apply_table_record(store, key_bytes, value_bytes, timestamp)
