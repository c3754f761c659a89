"""Kubernetes with the dask-kubernetes operator: one pod per GPU, one stock dask worker per pod."""

from dask_kubernetes.operator import KubeCluster, make_cluster_spec


def gpu_cluster_spec(name="gpu", image="my-registry/gpudask:latest", n_workers=4):
    spec = make_cluster_spec(name=name, image=image, n_workers=n_workers, worker_command="dask worker",
                             env={"DASK_GPUDASK__RMM__POOL_SIZE": "0.8"})
    worker = spec["spec"]["worker"]["spec"]["containers"][0]
    worker["resources"] = {"limits": {"nvidia.com/gpu": "1"}}  # the pod sees one GPU: one worker for it
    worker["args"] += ["--nworkers", "1", "--preload", "gpudask"]
    scheduler = spec["spec"]["scheduler"]["spec"]["containers"][0]
    # `dask scheduler`: distributed no longer installs a `dask-scheduler` command; no GPU for it
    scheduler["args"] = ["dask", "scheduler", *scheduler["args"][1:], "--preload", "gpudask"]
    return spec


if __name__ == "__main__":
    from distributed import Client

    cluster = KubeCluster(custom_cluster_spec=gpu_cluster_spec())
    client = Client(cluster)
