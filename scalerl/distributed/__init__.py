"""Scale-out on Ray: a pool of engine actors, FSDP2 trainer ranks as actors, weight sync, checkpoints.

Only `distributed.backend: ray` reaches this package (`scalerl.pipeline.assemble` imports it
lazily); the single-process loop never imports it, and it needs the `distributed` extra (Ray).
The controller process keeps the driver, the staleness controller, the prompt pool, the metrics
and the checkpoint state; what moves out sits behind the seams the local loop already has:

* `pool.EnginePool` is an `Engine`: N engine actors (`engine_actor`), groups to the least-loaded
  one, results as they finish, `version` = the minimum over live engines (so the max-lag
  admission proof of `scalerl.pipeline.staleness` holds for any N), dead engines' work re-issued.
* `trainer.RayTrainer` is a `Trainer`: `trainer_world_size` FSDP2 ranks (`scalerl.distributed.fsdp`)
  in Ray actors, each training its slice of every step with global denominators.
* `channel.RayWeightChannel` is a `WeightChannel`: after all ranks gathered the full weights,
  rank 0 sends them, bucketed, over the object store or a gloo/NCCL group (`weights`).
* `checkpoint` writes the ranks' DCP shards and HF export, then the driver's state last.
* `cluster` attaches to (or starts) Ray and bounds every wait with a timeout naming the peer.
"""
