"""Generated gRPC stubs of the federation service (``fedsbdt.proto.v1``; see protos/fedsbdt/proto/v1/federation.proto)."""
