"""`rose cluster certs` and `stack.dask_tls` without a cluster: the certificates chain to their
CA with each role's key usage, keys are 0600, nothing is overwritten without --force, and the
config names the file or the setting that is wrong."""
from __future__ import annotations

import os
import ssl
import stat
from pathlib import Path

import dask
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError
from typer.testing import CliRunner

from core.config import DaskTLS
from rose.config_file import ConfigError, load_run_config
from rose.stack.certs import ROLES, CertFiles, make_certs
from coordination.dask_security import DaskScheduler, security
from coordination.errors import StackError

SERVER, CLIENT = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _tls(files: CertFiles, role: str = "client") -> DaskTLS:
    return DaskTLS(ca_file=files.ca, cert_file=files.cert(role), key_file=files.key(role))


def test_certs_chain_to_their_ca_with_each_roles_usage(tmp_path):
    files = make_certs(tmp_path / "certs", days=30)
    ca = _cert(files.ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    verifier = PolicyBuilder().store(Store([ca])).build_client_verifier()
    for role in ROLES:
        leaf = _cert(files.cert(role))
        leaf.verify_directly_issued_by(ca)  # signed by this CA's key
        chain = verifier.verify(leaf, [])  # and valid under the CA as X.509 path validation sees it
        assert chain.chain[-1] == ca
        usages = set(leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
        assert usages == ({CLIENT} if role == "client" else {SERVER, CLIENT})
        assert 29 <= (leaf.not_valid_after_utc - leaf.not_valid_before_utc).days <= 30
        # a key file is its certificate's key, and nobody else may read it
        ssl.create_default_context().load_cert_chain(files.cert(role), files.key(role))
        assert stat.S_IMODE(files.key(role).stat().st_mode) == 0o600
        assert stat.S_IMODE(files.cert(role).stat().st_mode) == 0o644
    assert stat.S_IMODE(files.key("ca").stat().st_mode) == 0o600
    other = _cert(make_certs(tmp_path / "other").cert("client"))
    with pytest.raises(VerificationError):  # a certificate of another CA does not chain to this one
        verifier.verify(other, [])


def test_a_client_certificate_cannot_stand_in_for_a_scheduler(tmp_path):
    """OpenSSL checks the usage in the handshake, as distributed's contexts make it."""
    files = make_certs(tmp_path)

    def handshake(server_role: str) -> None:
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=files.ca)
        server.load_cert_chain(files.cert(server_role), files.key(server_role))
        client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=files.ca)
        client.check_hostname = False  # as distributed: a cluster's own CA, addresses not names
        client.load_cert_chain(files.cert("client"), files.key("client"))
        bios = [ssl.MemoryBIO() for _ in range(4)]
        s = server.wrap_bio(bios[0], bios[1], server_side=True)
        c = client.wrap_bio(bios[2], bios[3])
        for _ in range(10):  # pump bytes between the two ends until both finish
            done = 0
            for end, out, into in ((c, bios[3], bios[0]), (s, bios[1], bios[2])):
                try:
                    end.do_handshake()
                    done += 1
                except ssl.SSLWantReadError:
                    pass
                into.write(out.read())
            if done == 2:
                return
        raise AssertionError("the handshake did not finish")

    handshake("scheduler")
    handshake("worker")
    with pytest.raises(ssl.SSLError, match="unsuitable certificate purpose"):
        handshake("client")


def test_certs_refuse_to_overwrite_without_force(tmp_path):
    files = CertFiles(tmp_path)
    files.cert("client").write_text("mine")
    with pytest.raises(StackError, match="already holds client.pem: not overwritten"):
        make_certs(tmp_path)
    assert files.cert("client").read_text() == "mine" and not files.ca.exists()  # nothing written
    files.cert("client").unlink()
    make_certs(tmp_path)
    before = {p: p.read_bytes() for p in files.all()}
    with pytest.raises(StackError, match="ca.pem, ca-key.pem, scheduler.pem"):
        make_certs(tmp_path)
    assert {p: p.read_bytes() for p in files.all()} == before
    make_certs(tmp_path, force=True)
    assert all(p.read_bytes() != before[p] for p in files.all())  # a new CA, new keys
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in files.all())  # no temporaries left


def test_cli_cluster_certs_prints_what_it_wrote_and_the_config_lines(tmp_path):
    from rose.cli import app

    out = CliRunner().invoke(app, ["cluster", "certs", str(tmp_path / "c")])
    assert out.exit_code == 0, out.output
    d = tmp_path / "c"
    for line in (f"ca_file: {d / 'ca.pem'}", f"cert_file: {d / 'client.pem'}",
                 f"key_file: {d / 'client-key.pem'}", "dask_scheduler: tls://$HEAD:8786",
                 f"--tls-cert {d / 'scheduler.pem'} --tls-key {d / 'scheduler-key.pem'}",
                 f"dask worker tls://$HEAD:8786 --tls-ca-file {d / 'ca.pem'}"):
        assert line in out.output
    again = CliRunner().invoke(app, ["cluster", "certs", str(d)])
    assert again.exit_code == 1 and "already holds" in again.output and "--force" in again.output
    assert CliRunner().invoke(app, ["cluster", "certs", str(d), "--force"]).exit_code == 0


def _load(tmp_path: Path, **tls) -> None:
    load_run_config(None, {"stack": {"dask_scheduler": "tls://10.0.0.1:8786", "dask_tls": tls}})


def test_config_names_the_tls_file_that_is_wrong(tmp_path, monkeypatch):
    files = make_certs(tmp_path)
    good = {"ca_file": str(files.ca), "cert_file": str(files.cert("client")),
            "key_file": str(files.key("client"))}
    monkeypatch.chdir(tmp_path)
    cfg = load_run_config(None, {"stack": {"dask_scheduler": "tls://10.0.0.1:8786",
                                           "dask_tls": {**good, "ca_file": "ca.pem"}}})
    assert cfg.stack.dask_tls.ca_file == files.ca  # made absolute: stack.json is read elsewhere
    with pytest.raises(ConfigError, match=r"'stack.dask_tls.ca_file'.*/nope/ca.pem does not exist"):
        _load(tmp_path, **{**good, "ca_file": str(tmp_path / "nope" / "ca.pem")})
    with pytest.raises(ConfigError, match=r"'stack.dask_tls.key_file'.* is a directory"):
        _load(tmp_path, **{**good, "key_file": str(tmp_path)})
    (tmp_path / "plain.txt").write_text("not a certificate")
    with pytest.raises(ConfigError, match=r"'stack.dask_tls.cert_file'.*plain.txt is not a PEM file"):
        _load(tmp_path, **{**good, "cert_file": str(tmp_path / "plain.txt")})
    locked = files.key("client")
    locked.chmod(0)
    if os.geteuid() == 0:  # root reads any file: stand in for the kernel's refusal
        real = Path.read_bytes
        monkeypatch.setattr(Path, "read_bytes", lambda p: (_ for _ in ()).throw(PermissionError)
                            if p == locked else real(p))
    with pytest.raises(ConfigError, match=r"'stack.dask_tls.key_file'.*client-key.pem cannot be read "
                                          r"\(permission denied\)"):
        _load(tmp_path, **good)


def test_config_wants_a_tls_scheduler_address_with_dask_tls(tmp_path):
    files = make_certs(tmp_path)
    tls = _tls(files).model_dump(mode="json")
    for scheduler in (None, "tcp://10.0.0.1:8786"):
        with pytest.raises(ConfigError, match=r"stack.dask_tls needs stack.dask_scheduler: "
                                              r"tls://host:port.*local stack on 127.0.0.1 stays plain"):
            load_run_config(None, {"stack": {"dask_scheduler": scheduler, "dask_tls": tls}})


def test_security_names_a_key_that_is_not_the_certificates(tmp_path):
    files = make_certs(tmp_path)
    sec = security(_tls(files))
    assert sec.require_encryption and sec.tls_client_cert == str(files.cert("client"))
    assert security(None) is None and DaskScheduler("tcp://h:1").client_kwargs() == {}
    wrong = DaskTLS(ca_file=files.ca, cert_file=files.cert("client"), key_file=files.key("worker"))
    with pytest.raises(StackError, match="client.pem with .*worker-key.pem.*KEY_VALUES_MISMATCH"):
        security(wrong)
    with pytest.raises(StackError, match="tcp://h:1 is not a tls:// address"):
        DaskScheduler("tcp://h:1", _tls(files)).client_kwargs()
    runner = DaskScheduler("tls://h:1", _tls(files)).task_runner()
    assert runner.client_kwargs["security"].tls_ca_file == str(files.ca)
    with pytest.raises(StackError, match="tls://h:1 speaks TLS: set stack.dask_tls"):
        DaskScheduler("tls://h:1").client_kwargs()
    with dask.config.set({"distributed.comm.tls.client.cert": str(files.cert("client"))}):
        assert DaskScheduler("tls://h:1").client_kwargs() == {}  # Dask's own TLS config serves


def test_stack_file_records_the_tls_files_for_later_clients(tmp_path):
    from coordination.stack_record import StackHandle

    files = make_certs(tmp_path)
    handle = StackHandle(tmp_path, "http://h:4200/api", "http://h:4200", "tls://h:8786", None, None,
                         "filesystem", {}, dask_tls=_tls(files).model_dump(mode="json"))
    again = StackHandle.from_json(handle.to_json())
    assert again.scheduler() == DaskScheduler("tls://h:8786", _tls(files))
    files.ca.unlink()
    with pytest.raises(ValueError, match="ca.pem does not exist"):
        again.scheduler()
