"""Who may read the worker's HTTP endpoint, over what, and on which address (issue 47).

``HTTPSecurity`` is the endpoint's security settings, read and checked once when the worker is
built (``processor run --http-tls-cert/--http-tls-key/--http-tls-client-ca/--http-tls-ca/
--http-auth-token-file/--http-metrics-auth``): the server's TLS context, the client context a
worker forwards queries to another with, and the bearer token.

Invariants:

1. **The probes are always open**: ``/healthz`` and ``/readyz`` never ask for credentials (a
   Kubernetes probe presents none); ``/metrics`` asks for them only with ``metrics_auth``.
2. **The data routes are closed once a credential is configured**: with a token file or a client
   CA, ``/stores`` and ``/metadata`` answer only a request that presents the token
   (``Authorization: Bearer <token>``, compared in constant time) or a client certificate that
   chains to the client CA. Either credential is enough. A certificate that does not chain is
   refused by the TLS handshake itself; a connection without one is accepted (the probes need
   it) and its data requests are answered 401. No credential: 401; a wrong token: 403.
3. **Forwarding carries the credentials**: a worker asking another (a forwarded query, its own
   advertised-address probe) presents the token and, over TLS, its own certificate, and
   verifies the other's certificate and host name against ``tls_ca`` (the system's CAs when
   none is given). A fleet shares one token file and one CA.
4. **Local unless asked otherwise**: the endpoint binds 127.0.0.1 unless ``--http-host`` names
   an address, or ``--application-server`` names a host that is not a loopback one (then
   0.0.0.0: the other workers must reach it). Data routes reachable from other machines without
   a credential are named in one warning line at start.
"""

from __future__ import annotations

import hmac
import ipaddress
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from processor.config import check_application_server
from processor.errors import ConfigError

LOOPBACK = "127.0.0.1"
ANY = "0.0.0.0"


def default_bind_host(application_server: str | None) -> str:
    """The address the endpoint listens on when ``--http-host`` is not given (invariant 4)."""
    if application_server is None:
        return LOOPBACK
    host, _ = check_application_server(application_server)
    return LOOPBACK if is_loopback(host) else ANY


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False   # a host name: other machines reach it


@dataclass(frozen=True)
class HTTPSecurity:
    """The endpoint's TLS and authentication settings (see the module docstring). Files are read
    when it is built: a missing or unreadable file, a key that does not match its certificate or
    an empty token file is a ``ConfigError`` (exit code 2), before anything else is touched."""

    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None   # mutual TLS: client certificates must chain to these CAs
    tls_ca: str | None = None          # the CAs other workers' certificates are checked against
    auth_token_file: str | None = None
    metrics_auth: bool = False
    _token: bytes | None = field(default=None, init=False, repr=False, compare=False)
    _server_context: ssl.SSLContext | None = field(default=None, init=False, repr=False, compare=False)
    _client_context: ssl.SSLContext | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--http-tls-cert and --http-tls-key go together (the endpoint's certificate and its "
                              "private key, PEM files)")
        if self.tls_cert is None and (self.tls_client_ca or self.tls_ca):
            raise ConfigError("--http-tls-client-ca and --http-tls-ca need TLS: --http-tls-cert and --http-tls-key")
        if self.metrics_auth and not self.authenticates:
            raise ConfigError("--http-metrics-auth needs a credential to ask for: --http-auth-token-file or "
                              "--http-tls-client-ca")
        if self.auth_token_file is not None:
            try:
                token = Path(self.auth_token_file).read_text().strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"--http-auth-token-file {self.auth_token_file}: cannot read it ({exc})") from None
            if not token or any(c.isspace() for c in token) or not token.isascii():
                raise ConfigError(f"--http-auth-token-file {self.auth_token_file}: the token must be one line of "
                                  f"printable ASCII without spaces (e.g. `openssl rand -hex 32`)")
            object.__setattr__(self, "_token", token.encode())
        if self.tls_cert is not None:
            object.__setattr__(self, "_server_context", self._make_server_context())
            object.__setattr__(self, "_client_context", self._make_client_context())

    # -- what the endpoint asks ------------------------------------------------------------------
    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def authenticates(self) -> bool:
        """Whether the data routes ask for a credential (invariant 2)."""
        return self.auth_token_file is not None or self.tls_client_ca is not None

    @property
    def server_context(self) -> ssl.SSLContext | None:
        return self._server_context

    @property
    def client_context(self) -> ssl.SSLContext | None:
        return self._client_context

    def peer_headers(self) -> dict[str, str]:
        """The headers a worker's requests to another worker carry (invariant 3)."""
        return {"Authorization": f"Bearer {self._token.decode()}"} if self._token is not None else {}

    def refusal(self, authorization: str | None, client_cert: bool) -> tuple[int, str] | None:
        """None when a request with this ``Authorization`` header (and a verified client
        certificate or not) may read the data routes, else ``(401 or 403, why)``."""
        if not self.authenticates:
            return None
        if client_cert and self.tls_client_ca is not None:
            return None   # (verified by the handshake: an unverified one never gets here)
        if authorization is None:
            wanted = " or ".join(w for w, on in (("a bearer token (Authorization: Bearer <token>)",
                                                  self._token is not None),
                                                 ("a client certificate", self.tls_client_ca is not None)) if on)
            return 401, f"authentication required: {wanted}"
        if self._token is None:
            return 401, "authentication required: a client certificate (this endpoint takes no token)"
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return 401, "authentication required: Authorization: Bearer <token>"
        if not hmac.compare_digest(given.strip().encode("utf-8", "replace"), self._token):
            return 403, "the bearer token is not this endpoint's"
        return None

    def exposure_warning(self, host: str, port: int) -> str | None:
        """One line when the data routes are open beyond this machine (invariant 4), else None."""
        if is_loopback(host):
            return None
        if not self.authenticates:
            return (f"HTTP endpoint on {host}:{port}: /stores and /metadata answer anyone who reaches this port "
                    f"(no --http-auth-token-file or --http-tls-client-ca; docs/operations.md \"Securing the HTTP "
                    f"endpoint\")")
        if not self.tls:
            return (f"HTTP endpoint on {host}:{port}: the bearer token crosses the network in clear text (no "
                    f"--http-tls-cert/--http-tls-key)")
        return None

    # -- contexts ---------------------------------------------------------------------------------
    def _make_server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        assert self.tls_cert is not None
        try:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--http-tls-cert {self.tls_cert} / --http-tls-key {self.tls_key}: {exc}") from None
        if self.tls_client_ca is not None:
            try:
                ctx.load_verify_locations(cafile=self.tls_client_ca)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"--http-tls-client-ca {self.tls_client_ca}: {exc}") from None
            # optional at the handshake: the probes come without one (invariant 1); a certificate
            # that is presented must chain to the CA, or the handshake fails
            ctx.verify_mode = ssl.CERT_OPTIONAL
        return ctx

    def _make_client_context(self) -> ssl.SSLContext:
        try:
            ctx = ssl.create_default_context(cafile=self.tls_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--http-tls-ca {self.tls_ca}: {exc}") from None
        assert self.tls_cert is not None
        ctx.load_cert_chain(self.tls_cert, self.tls_key)   # (presented to workers that ask for one: mutual TLS)
        return ctx


NO_SECURITY = HTTPSecurity()
