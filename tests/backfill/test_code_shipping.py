"""What the backfill ships to the executors (``backfill/code_shipping.py``): a package directory as a
zip whose bytes depend only on its files, so that two backfills of the same code in one Spark
session ship the same file (Spark refuses a second ``addPyFile`` of a name whose bytes differ;
found when the differential's second case that refers to the tests package failed)."""

import os
import time
import zipfile

from backfill.code_shipping import _zip_package


def test_a_packages_zip_depends_only_on_its_files(tmp_path):
    pkg = tmp_path / "src" / "mypkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "mod.py").write_text("X = 1\n")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "junk.py").write_text("not shipped")
    (tmp_path / "a").mkdir()
    first = _zip_package(pkg, str(tmp_path / "a"))
    time.sleep(1.1)                                                   # a later second: same bytes
    os.utime(pkg / "sub" / "mod.py", (time.time() + 100, time.time() + 100))
    (tmp_path / "b").mkdir()
    second = _zip_package(pkg, str(tmp_path / "b"))
    assert open(first, "rb").read() == open(second, "rb").read()
    assert zipfile.ZipFile(first).namelist() == ["mypkg/", "mypkg/__init__.py", "mypkg/sub/", "mypkg/sub/mod.py"]
    (pkg / "sub" / "mod.py").write_text("X = 2\n")                   # other code: other bytes
    (tmp_path / "c").mkdir()
    assert open(_zip_package(pkg, str(tmp_path / "c")), "rb").read() != open(first, "rb").read()
