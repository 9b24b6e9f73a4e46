# fedsbdt: one image for the coordinator and the hospital sites (see docker-compose.yml).
#
#   podman build -t fedsbdt:latest .        (or docker build; docs/deployment.md §4)
#
# BASE_IMAGE: any Debian-based image with Python 3.11 and its venv module — the official slim
# image by default, or a hospital's own approved base image (--build-arg BASE_IMAGE=...).
# Offline: with wheels in wheels/ (pip wheel, docs/deployment.md "Building the image offline")
# pip installs from those only (--no-index) and the build needs no network (--network none).
#
# The image runs the built wheel, installed as a hospital installs it (not editable, no sources).
ARG BASE_IMAGE=python:3.11-slim

# 1. The fedsbdt wheel, built from the sources with the build backend pyproject.toml names.
FROM ${BASE_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY common ./common
COPY server ./server
COPY client ./client
COPY protos ./protos
COPY examples ./examples
RUN --mount=type=bind,source=wheels,target=/wheels \
    set -e; \
    python3 -m venv /build; \
    if ls /wheels/*.whl >/dev/null 2>&1; then from="--no-index --find-links /wheels"; else from=""; fi; \
    /build/bin/python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))' \
        > /tmp/build-requirements.txt; \
    /build/bin/pip install -q $from -r /tmp/build-requirements.txt; \
    /build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /dist .

# 2. The image: the dependencies, as pyproject.toml lists them, into a virtualenv (a layer of its own: it
#    survives changes to the code), then the wheel from stage 1.
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NUMBA_CACHE_DIR=/var/cache/fedsbdt/numba \
    PATH=/opt/fedsbdt/venv/bin:$PATH

WORKDIR /opt/fedsbdt
COPY pyproject.toml ./
RUN --mount=type=bind,source=wheels,target=/wheels \
    set -e; \
    python3 -m venv /opt/fedsbdt/venv; \
    if ls /wheels/*.whl >/dev/null 2>&1; then \
        echo "fedsbdt: installing from wheels/ only (pip --no-index)"; from="--no-index --find-links /wheels"; \
    else \
        echo "fedsbdt: wheels/ is empty, installing from the package index"; from=""; \
    fi; \
    python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb")); \
print("\n".join(p["project"]["dependencies"]))' > /tmp/requirements.txt; \
    pip install $from -r /tmp/requirements.txt; \
    rm /tmp/requirements.txt pyproject.toml

# The wheel of stage 1 is copied, not bind-mounted into the RUN below: podman's (buildah's) layer cache does not
# look into a bind mount's content, so that RUN came from the cache after a change to the code, and the image
# tagged held the code of an older build.
# The exact noise samplers compiled into numba's cache (NUMBA_CACHE_DIR) now: a site's first noise draw,
# before it joins, then takes a second instead of ~15 s of compiling (on a host with the build host's CPU).
COPY --from=wheel /dist /dist
RUN pip install --no-index --no-deps /dist/fedsbdt-*.whl && rm -r /dist && mkdir -p /var/cache/fedsbdt/numba \
    && python -c "import fedsbdt.cli, fedsbdt.proto.v1.federation_pb2_grpc" \
    && python -c "from fedsbdt.client.isolated_noise import compile_samplers; compile_samplers()"

# The coordinator's port (mutual TLS).
EXPOSE 7443
ENTRYPOINT []
CMD ["fedsbdt", "--help"]
