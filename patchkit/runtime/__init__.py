"""The runtime: everything a process loads when it calls ``patchkit.apply_all()``.

Declarations (:mod:`.declaration`), version resolution (:mod:`.versions`), installing and undoing
actions (:mod:`.installer`), the pure decision (:mod:`.decision`), the engine that applies and reverts
through it (:mod:`.engine`; per-patch records :mod:`.entries`, carrying out installs :mod:`.jobs`,
import dispatch :mod:`.import_watch` over :mod:`.hooks`, fork handling :mod:`.forking`), ``PATCHKIT_*``
settings (:mod:`.settings`), config probing (:mod:`.probing`), status records (:mod:`.status`),
finding declarations (:mod:`.catalogue`, from the index :mod:`.index`), what the index alone settles
(:mod:`.settle`, which the first ``apply_all()`` of a process does without an engine:
:mod:`.process_engine`), typed errors (:mod:`.errors`), record classes (:mod:`.records`) and the
drift check (:mod:`.drift`, :mod:`.fingerprint`). Nothing here imports the tooling (``patchkit.matrix``, the CLI,
``patchkit.processes``), Megatron, vLLM or torch.
"""
