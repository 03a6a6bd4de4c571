"""Facts the nvidia deploy reads on a node before it changes anything.

One command reads everything, and needs no NVIDIA software: the PCI bus from sysfs
(GPUs and NVSwitches by NVIDIA's vendor id, without a driver), ``nvidia-smi`` when it
exists (model, memory, driver version, persistence mode), the loaded kernel module's
version (``/sys/module/nvidia/version``) and the installed one (``modinfo``), RDMA
devices (``/sys/class/infiniband``), container runtimes, and which packages at the
driver's version are held. A tool that is missing reads as "none", never as an error:
on a bare node the fact is all empty. The Ansible role runs the very same command
(handed over as ``nvidia_fact_command``) and parses it with :func:`parse` through its
filter plugin.
"""

from __future__ import annotations

from aicluster.common.facts import ParsedFact
from aicluster.components.nvidia.probe import FACT_COMMAND, parse


class NvidiaNode(ParsedFact):
    """What the node has of NVIDIA hardware and software (see :func:`parse`)."""

    shell = FACT_COMMAND
    parse = staticmethod(parse)
