"""UnreadAdmissions: requests the early refusals let in, counted against the room until they arrive."""
from aclserve.scheduling.unread import LAPSE_S, UnreadAdmissions


def test_admits_while_the_room_exceeds_those_not_arrived():
    unread = UnreadAdmissions()
    assert [unread.admit(2, 0.0) for _ in range(3)] == [True, True, False]


def test_an_arrival_frees_the_oldest_admission():
    unread = UnreadAdmissions()
    assert unread.admit(1, 0.0)
    assert not unread.admit(1, 0.001)
    unread.arrived()
    assert unread.admit(1, 0.002)


def test_arrivals_without_admissions_are_ignored():
    unread = UnreadAdmissions()
    unread.arrived()  # a request that came through aiohttp without being let in here
    assert unread.admit(1, 0.0) and not unread.admit(1, 0.0)


def test_an_admission_that_never_arrives_lapses_however_many_follow():
    unread = UnreadAdmissions()
    assert unread.admit(2, 0.0)
    assert unread.admit(2, LAPSE_S * 0.9)  # within the first's lapse: both count, no room left
    assert not unread.admit(2, LAPSE_S * 0.95)
    assert unread.admit(2, LAPSE_S * 1.01)  # the first lapsed, the second still counts
    assert not unread.admit(2, LAPSE_S * 1.02)
