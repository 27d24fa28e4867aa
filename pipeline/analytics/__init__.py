"""What happens to a camera's detections after the detector, in the camera's frame order:
filters and masks → tracker → lines and zones → events (:mod:`streams.object_events`).

Batches mix cameras; analytics never does: the publisher hands each camera's frames to that
camera's :class:`~pipeline.analytics.camera.CameraAnalytics` in the order they were decoded.
Its state (tracks, which side of each line a track is on, who is in which zone) is written to
Redis with the acknowledgement of the frames it has seen (:mod:`pipeline.analytics.store`), so it
moves with the camera's lease and outlives a worker or a daemon.
"""
