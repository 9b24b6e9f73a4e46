"""XGBoost's own horizontal federated training, one process per party (benchmarks/reconstruction.py).

``python fedxgb.py server PORT SITES`` runs the federated server; ``python fedxgb.py worker PORT SITES RANK DATA.npz
PARAMS.json ROUNDS OUT.json`` one site (its rows ``X``, ``y`` in the npz); rank 0 writes the model (JSON).  Only
numpy and xgboost are imported, so each party starts in about a second.
"""
from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    import numpy as np
    import xgboost as xgb
    from xgboost import collective, federated

    role, port, sites = argv[0], int(argv[1]), int(argv[2])
    if role == "server":
        federated.run_federated_server(n_workers=sites, port=port)
        return 0
    rank, data, params, rounds, out = int(argv[3]), argv[4], argv[5], int(argv[6]), argv[7]
    with np.load(data) as z:
        X, y = z["X"], z["y"]
    with open(params) as f:
        p = json.load(f)
    with collective.CommunicatorContext(dmlc_communicator="federated", federated_server_address=f"localhost:{port}",
                                        federated_world_size=sites, federated_rank=rank):
        booster = xgb.train(p, xgb.DMatrix(X, y), rounds)
    if rank == 0:
        with open(out, "wb") as f:
            f.write(booster.save_raw("json"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
