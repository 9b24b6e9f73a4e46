"""docker-compose.yml and Dockerfile: structure, and every command parses with fedsbdt's own parser."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedsbdt.cli import build_parser

from .conftest import ROOT

COMPOSE = ROOT / "docker-compose.yml"
HOSPITALS = ["hospital-1", "hospital-2", "hospital-3"]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def volumes(service: dict) -> dict[str, tuple[str, str]]:
    """container path -> (host path, mode)."""
    out = {}
    for v in service["volumes"]:
        parts = v.split(":")
        out[parts[1]] = (parts[0], parts[2] if len(parts) > 2 else "rw")
    return out


def parse(command: list[str]):
    assert command[0] == "fedsbdt"
    return build_parser().parse_args(command[1:])


def test_services_are_a_coordinator_and_three_hospitals(compose):
    assert set(compose["services"]) == {"coordinator", *HOSPITALS}
    for name, svc in compose["services"].items():
        assert svc["image"] == "fedsbdt:latest" and svc["build"] == "."
        assert isinstance(svc["command"], list) and all(isinstance(x, str) for x in svc["command"])
    assert compose["services"]["coordinator"]["ports"] == ["7443:7443"]


def test_a_refused_hospital_is_not_restarted_and_the_coordinator_is(compose):
    """A client's exit 2 is a refusal (the plan breaks its policy, bad data or keys) that no restart changes;
    compose's restart policies cannot tell exit codes apart, so the hospitals are never restarted (issue 36: a
    refused client was restarted five times).  The coordinator resumes from its checkpoint after a failure."""
    assert compose["services"]["coordinator"]["restart"] == "on-failure:5"
    for h in HOSPITALS:
        assert compose["services"][h]["restart"] == "no", h  # the string "no" (a bare no would be YAML's false)


def test_every_command_parses_with_the_cli_and_matches_its_volumes(compose):
    coord = compose["services"]["coordinator"]
    a = parse(coord["command"])
    assert a.command == "coordinator" and not a.insecure  # mutual TLS: certificates live in the state volume
    vols = volumes(coord)
    assert a.state in vols and vols[a.state][1] == "rw"
    assert str(Path(a.plan).parent) in vols and vols[str(Path(a.plan).parent)][1] == "ro"
    port = a.listen.rsplit(":", 1)[1]
    host_state = set()
    for h in HOSPITALS:
        svc = compose["services"][h]
        b = parse(svc["command"])
        assert b.command == "client" and b.site == h and not b.insecure
        assert b.coordinator == f"coordinator:{port}"
        assert svc["depends_on"] == ["coordinator"]
        v = volumes(svc)
        data_dir = str(Path(b.data).parent)
        assert v[data_dir][1] == "ro" and h in v[data_dir][0]  # its own data, read-only
        assert v[b.state][1] == "rw" and v[b.state][0].endswith(h)  # its own state (ledger, keys, certificates)
        assert b.max_epsilon is not None and b.plan is not None
        host_state.add(v[b.state][0])
    assert len(host_state) == 3 and volumes(coord)[a.state][0] not in host_state


def test_prepare_writes_every_file_the_compose_services_mount(compose, tmp_path, monkeypatch):
    """``fedsbdt demo --prepare deploy --host coordinator`` produces the layout the services expect."""
    from fedsbdt.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--prepare", "deploy", "--host", "coordinator", "--host", "localhost", "--trees", "3"]) == 0
    for name, svc in compose["services"].items():
        args = parse(svc["command"])
        mounts = volumes(svc)

        def host(path: str) -> Path:
            for cpath, (hpath, _) in mounts.items():
                if path == cpath or path.startswith(cpath + "/"):
                    return tmp_path / hpath / path[len(cpath):].lstrip("/")
            raise AssertionError(f"{name}: {path} is not on a volume")

        assert host(args.plan).is_file()
        state = host(args.state)
        for f in ("tls.crt", "tls.key", "ca.crt"):
            assert (state / f).is_file(), (name, f)
        if name != "coordinator":
            assert host(args.data).is_file() and (state / "identity.key").is_file()
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((tmp_path / "deploy/coordinator/tls.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "coordinator" in san.get_values_for_type(x509.DNSName)  # the host name the hospitals dial


def test_dockerfile_installs_the_built_wheel():
    """(The image is built and run for real in test_compose_podman.py, where podman exists.)"""
    text = (ROOT / "Dockerfile").read_text()
    assert text.startswith("#") and "ARG BASE_IMAGE=python:3.11-slim\n" in text
    assert text.count("FROM ${BASE_IMAGE}") == 2  # the wheel's build stage, then the image
    assert "--no-index --find-links /wheels" in text and (ROOT / "wheels" / "README.md").is_file()
    for needed in ("COPY pyproject.toml setup.py", "COPY protos", "COPY common", "COPY server", "COPY client", "COPY examples",
                   "pip wheel --no-deps", "pip install --no-index --no-deps /dist/fedsbdt-*.whl"):
        assert needed in text
    assert "-e ." not in text, "the image must run the built wheel, not an editable checkout"
