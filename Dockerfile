# fedsbdt: one image for the coordinator and the hospital sites (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    NUMBA_CACHE_DIR=/var/cache/fedsbdt/numba

WORKDIR /opt/fedsbdt
COPY pyproject.toml README.md ./
COPY common ./common
COPY server ./server
COPY client ./client
COPY protos ./protos
COPY examples ./examples
# Editable install keeps the repository layout (bundled examples, generated stubs under protos/).
RUN pip install -e . && mkdir -p /var/cache/fedsbdt/numba \
    && python -c "import common.cli, server.cli, client.cli, fedsbdt.v1.federation_pb2_grpc"

# The coordinator's port (mutual TLS).
EXPOSE 7443
ENTRYPOINT []
CMD ["fedsbdt", "--help"]
