"""The stages of one batch worker, each on its own thread, sharing one :class:`Lifecycle`:

reader (frames streams → batching policy → prepared batch) → inferer (detector) → publisher
(post-processing → sinks → acknowledgement).  :class:`pipeline.stages.worker.BatchWorker` wires
them together.
"""
