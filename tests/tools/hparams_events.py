"""Reading back a TensorBoard HParams session (what TensorBoard's HParams tab reads) for the search tools' tests."""
from __future__ import annotations

import os


def read_session(folder: str | os.PathLike) -> tuple[dict, dict, dict]:
    """``(hparams, metrics, domains)`` of the HParams session in ``folder``: hparam name -> value (number or string),
    metric tag -> its scalar, hparam name -> its discrete domain (only those that have one)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    hparams = {name: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
               for name, value in start.hparams.items()}
    metrics = {info.name.tag: [e.value for e in acc.Scalars(info.name.tag)] for info in experiment.metric_infos}
    domains = {info.name: [getattr(v, v.WhichOneof("kind")) for v in info.domain_discrete.values]
               for info in experiment.hparam_infos if info.HasField("domain_discrete")}
    return hparams, metrics, domains
