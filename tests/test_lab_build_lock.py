"""Two processes (or workers) asking for one lab family at once: the second waits for the first's build."""

import threading

from kinfolk.lab.world.family import _one_build_at_a_time


def test_a_second_build_of_the_same_key_waits_for_the_first(tmp_path):
    root, order = tmp_path / "cache" / "0123abcd", []
    first_inside, release_first = threading.Event(), threading.Event()

    def first():
        with _one_build_at_a_time(root, progress=False):
            order.append("first in")
            first_inside.set()
            release_first.wait(timeout=30)
            order.append("first out")

    def second():
        first_inside.wait(timeout=30)
        with _one_build_at_a_time(root, progress=False):  # a separate open file: flock makes it wait
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    first_inside.wait(timeout=30)
    threads[1].join(timeout=0.5)  # the second is still waiting
    assert threads[1].is_alive() and order == ["first in"]
    release_first.set()
    for thread in threads:
        thread.join(timeout=30)
    assert order == ["first in", "first out", "second in"]
    assert (root.parent / f"{root.name}.lock").exists() and not root.exists()  # the lock sits beside the family


def test_other_keys_do_not_wait(tmp_path):
    with _one_build_at_a_time(tmp_path / "key-a", progress=False):
        done = threading.Event()

        def other():
            with _one_build_at_a_time(tmp_path / "key-b", progress=False):
                done.set()

        thread = threading.Thread(target=other)
        thread.start()
        assert done.wait(timeout=30)
        thread.join()
