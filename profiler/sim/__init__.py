"""A simulated accelerator: a device model that stands in for a GPU on a machine without one.

The real input pipeline runs as it is; only the model's arithmetic is replaced by the device model. Modules:
``specs`` (datasheet figures per accelerator, the ``sim:NAME[,...]`` parser), ``cost`` (FLOPs, kernels and
device memory of one training step, counted on the meta device), ``device`` (streams with CUDA's ordering,
a timer behind the Session's device-timer interface), ``nvml`` (a simulated NVML source). Every figure that
comes from here is labelled simulated wherever it is shown.
"""
