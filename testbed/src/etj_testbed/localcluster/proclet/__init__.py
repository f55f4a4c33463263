"""Process-backed nodes: a small kubelet stand-in that runs pods as local processes (test/demo harness).

``harness`` (the ``Proclet`` loop), ``launch`` (``start_subprocess``, ``main``), ``lookups`` (ConfigMaps,
Secrets and Services a pod's env names), ``nodes`` (node status, leases, labels), ``pod`` (one pod's
processes), ``pod_env`` (what its containers run with), ``env`` (a container's env and loopback
addresses), ``status`` (pod status), ``proc`` (process groups and markers), ``kube`` (the small API
client). Run it with
``python -m etj_testbed.localcluster.proclet`` (``__main__``). Nothing is imported here: each importer
names the module it needs, so a light one (``kube``) does not load the whole harness.
"""
