"""A dispatch split into batches of one image shape each, a camera's frames in its order."""

from __future__ import annotations

from pipeline.stages.reader import batches_by_shape

WIDE, TALL = (384, 640, 3), (640, 384, 3)


def test_one_batch_a_shape_in_the_order_the_shapes_come():
    shapes = [WIDE, TALL, WIDE, TALL]
    assert batches_by_shape(shapes, ["a", "b", "c", "d"]) == [[0, 2], [1, 3]]


def test_a_camera_whose_picture_changed_size_keeps_its_order():
    """y's tall frame comes first; x's wide frame then its tall one (a new session): x's tall
    frame must not go in y's batch, published before x's wide one."""
    shapes = [TALL, WIDE, TALL]
    batches = batches_by_shape(shapes, ["y", "x", "x"])
    assert batches == [[0], [1], [2]]
    order = [i for batch in batches for i in batch]
    assert order.index(1) < order.index(2)


def test_every_frame_once_and_each_camera_in_order():
    shapes = [WIDE, TALL, TALL, WIDE, WIDE, TALL, WIDE]
    cameras = ["a", "b", "a", "b", "c", "c", "a"]
    batches = batches_by_shape(shapes, cameras)
    published = [i for batch in batches for i in batch]
    assert sorted(published) == list(range(len(shapes)))
    for batch in batches:
        assert len({shapes[i] for i in batch}) == 1
    for camera in set(cameras):
        mine = [i for i in published if cameras[i] == camera]
        assert mine == sorted(mine)
