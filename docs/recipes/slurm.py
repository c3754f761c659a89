"""Slurm with dask-jobqueue: one job per GPU node, one stock dask worker per GPU."""

import gpudask
from dask_jobqueue import SLURMCluster


def gpu_cluster(gpus_per_node=4, cpus_per_node=32, memory="480GB", protocol="ucx", **kwargs):
    gpudask.initialize(protocol=protocol)  # this process is the client: set it up too
    return SLURMCluster(
        protocol=protocol,
        processes=gpus_per_node,  # dask worker --nworkers N: one worker per GPU of the node
        cores=gpus_per_node,  # one thread per worker, so one task at a time on each GPU
        job_cpu=cpus_per_node,  # the CPUs Slurm gives the job (gpudask binds each worker near its GPU)
        memory=memory,
        job_extra_directives=[f"--gres=gpu:{gpus_per_node}"],
        worker_extra_args=["--preload", "gpudask"],
        job_script_prologue=["export DASK_GPUDASK__RMM__POOL_SIZE=0.8"],
        scheduler_options={"preload": ["gpudask"]},
        **kwargs,
    )


if __name__ == "__main__":
    from distributed import Client

    cluster = gpu_cluster()
    print(cluster.job_script())
    cluster.scale(jobs=2)  # two nodes
    client = Client(cluster)
