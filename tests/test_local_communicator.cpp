// The local communicator (ranks as threads) collective by collective, at 1 to 4 ranks: values
// against what each rank computes itself, reductions bit for bit in rank order, the byte
// counters against the base class's formulas (the same as MPI's), split, point-to-point
// matching by (source, tag) in posting order, and failure: a rank that throws releases the
// others, the watchdog ends a hung group with its one line, misuse is an Error.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_util.hpp"
#include "ulysses/comm/communicator_factory.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/comm/local_communicator.hpp"
#include "ulysses/comm/trace.hpp"

using namespace ulysses;

using test_util::error_of;

namespace {

// A byte that names who sent it to whom, and where in the block.
std::uint8_t mark(int from, int to, std::size_t i) { return std::uint8_t(from * 31 + to * 7 + int(i) * 3 + 1); }

std::int64_t sent(const Communicator& c, const std::string& op) {
  auto it = c.counters().find(op);
  return it == c.counters().end() ? -1 : it->second.bytes_sent;
}

template <class Fn>
void on_1_to_4(Fn&& fn) {
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE("n = " + std::to_string(n));
    run_local(n, fn);
  }
}

TEST(Local, AlltoallAndAlltoallvDeliverEveryBlockAndCountLikeMpi) {
  on_1_to_4([](Communicator& c) {
    const int n = c.size(), me = c.rank();
    const std::size_t b = 5;
    std::vector<std::uint8_t> send(b * std::size_t(n)), recv(send.size());
    for (int j = 0; j < n; ++j)
      for (std::size_t i = 0; i < b; ++i) send[std::size_t(j) * b + i] = mark(me, j, i);
    c.alltoall(send.data(), recv.data(), b, "a2a");
    for (int j = 0; j < n; ++j)
      for (std::size_t i = 0; i < b; ++i) EXPECT_EQ(recv[std::size_t(j) * b + i], mark(j, me, i));
    EXPECT_EQ(sent(c, "a2a"), std::int64_t(b) * (n - 1));
    // Blocks of size (from + to) % 3: some empty, each sized by who sends it to whom.
    std::vector<std::size_t> sb(static_cast<std::size_t>(n)), so(static_cast<std::size_t>(n)),
        rb(static_cast<std::size_t>(n)), ro(static_cast<std::size_t>(n));
    std::size_t st = 0, rt = 0;
    for (int j = 0; j < n; ++j) {
      sb[std::size_t(j)] = std::size_t((me + j) % 3);
      rb[std::size_t(j)] = std::size_t((j + me) % 3);
      so[std::size_t(j)] = st;
      ro[std::size_t(j)] = rt;
      st += sb[std::size_t(j)];
      rt += rb[std::size_t(j)];
    }
    std::vector<std::uint8_t> vs(st), vr(rt, 0);
    for (int j = 0; j < n; ++j)
      for (std::size_t i = 0; i < sb[std::size_t(j)]; ++i) vs[so[std::size_t(j)] + i] = mark(me, j, i);
    c.alltoallv(vs.data(), sb, so, vr.data(), rb, ro, "a2av");
    std::int64_t expect_bytes = 0, expect_msgs = 0;
    for (int j = 0; j < n; ++j) {
      for (std::size_t i = 0; i < rb[std::size_t(j)]; ++i) EXPECT_EQ(vr[ro[std::size_t(j)] + i], mark(j, me, i));
      if (j != me && sb[std::size_t(j)] > 0) expect_bytes += std::int64_t(sb[std::size_t(j)]), ++expect_msgs;
    }
    EXPECT_EQ(sent(c, "a2av"), expect_bytes);
    EXPECT_EQ(c.counters().at("a2av").messages, expect_msgs);
  });
}

TEST(Local, SeveralIalltoallvInFlightCompleteInAnyOrder) {
  on_1_to_4([](Communicator& c) {
    const int n = c.size(), me = c.rank();
    std::vector<std::size_t> bytes(std::size_t(n), 4), offs(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j) offs[std::size_t(j)] = std::size_t(j) * 4;
    std::vector<std::vector<std::uint8_t>> send(3, std::vector<std::uint8_t>(std::size_t(4 * n))), recv = send;
    std::vector<Request> reqs;
    for (std::size_t k = 0; k < 3; ++k) {
      for (int j = 0; j < n; ++j)
        for (std::size_t i = 0; i < 4; ++i) send[k][std::size_t(j) * 4 + i] = mark(me, j, i + k);
      reqs.push_back(c.ialltoallv(send[k], bytes, offs, recv[k], bytes, offs, "pipe"));
    }
    while (!reqs[1].test()) {
    }
    reqs[2].wait();
    reqs[0].wait();
    for (std::size_t k = 0; k < 3; ++k)
      for (int j = 0; j < n; ++j)
        for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(recv[k][std::size_t(j) * 4 + i], mark(j, me, i + k));
    EXPECT_EQ(c.counters().at("pipe").calls, 3);
  });
}

// Rank 0 waits for the all-to-all before the barrier, the others the other way round: a rank
// blocked in the barrier must still hand over its all-to-all data (as MPI's progress does).
TEST(Local, ARankBlockedElsewhereStillServesItsCollectivesInFlight) {
  run_local(3, [](Communicator& c) {
    const std::vector<std::size_t> bytes(3, 1), offs{0, 1, 2};
    std::uint8_t send[3] = {std::uint8_t(c.rank()), std::uint8_t(c.rank()), std::uint8_t(c.rank())}, recv[3] = {};
    Request r = c.ialltoallv({send, 3}, bytes, offs, {recv, 3}, bytes, offs);
    if (c.rank() == 0) r.wait();
    c.barrier();
    r.wait();
    EXPECT_EQ(recv[2], 2);
  });
}

// Host memory is a Buffer like a tensor's, so the collectives check that it holds every block
// before anything moves, on every rank alike (the same sizes fail the same way everywhere).
TEST(Local, HostBuffersTooSmallForTheirBlocksAreRefusedBeforeAnyTransfer) {
  auto error_of = [](const std::function<void(Communicator&)>& fn) {
    try {
      run_local(2, fn);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::vector<std::size_t> bytes{4, 4}, offsets{0, 4};
  EXPECT_NE(error_of([&](Communicator& c) {
              std::vector<std::uint8_t> send(8), recv(6);
              c.ialltoallv(send, bytes, offsets, recv, bytes, offsets).wait();
            }).find("ialltoallv recv: block 1 [4, 8) passes the end of its buffer of 6 bytes"),
            std::string::npos);
  EXPECT_NE(error_of([&](Communicator& c) {
              std::vector<float> mine(1), all(1);
              c.allgatherv(mine, all, bytes);
            }).find("allgatherv recv"),
            std::string::npos);
  EXPECT_NE(error_of([&](Communicator& c) {
              std::vector<float> send(1), recv(1);
              const std::vector<std::size_t> counts{1, 1};
              c.reduce_scatter_sum(send, recv, counts);
            }).find("reduce_scatter_sum send"),
            std::string::npos);
}

TEST(Local, GathersBroadcastAndBarrier) {
  on_1_to_4([](Communicator& c) {
    const int n = c.size(), me = c.rank();
    std::vector<std::int64_t> all = c.allgather_value(100 + me, "ag");
    for (int j = 0; j < n; ++j) EXPECT_EQ(all[std::size_t(j)], 100 + j);
    EXPECT_EQ(sent(c, "ag"), 8 * (n - 1));
    // allgatherv: rank j gives j + 1 bytes of value j.
    std::vector<std::size_t> bytes(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j) bytes[std::size_t(j)] = std::size_t(j + 1);
    std::vector<std::uint8_t> mine(std::size_t(me + 1), std::uint8_t(me)), got(std::size_t(n * (n + 1) / 2), 255);
    c.allgatherv(mine, got, bytes, "agv");
    std::size_t at = 0;
    for (int j = 0; j < n; ++j)
      for (int i = 0; i <= j; ++i) EXPECT_EQ(got[at++], std::uint8_t(j));
    EXPECT_EQ(sent(c, "agv"), std::int64_t(me + 1) * (n - 1));
    // gather to the last rank.
    const int root = n - 1;
    const std::int32_t v = 7 * me;
    std::vector<std::int32_t> g(std::size_t(n), -1);
    c.gather(&v, g.data(), sizeof(v), root, "g");
    for (int j = 0; j < n; ++j) EXPECT_EQ(g[std::size_t(j)], me == root ? 7 * j : -1);
    EXPECT_EQ(sent(c, "g"), me == root ? 0 : 4);
    double x[3] = {double(me), 1.5, -2.0};
    if (me == root) x[0] = 42;
    c.broadcast(x, sizeof(x), root);
    EXPECT_EQ(x[0], 42);
    c.barrier();
  });
}

TEST(Local, ReductionsAddInRankOrderBitForBit) {
  on_1_to_4([](Communicator& c) {
    const int n = c.size(), me = c.rank();
    auto value = [](int r, std::size_t i) { return 1.0f / float(3 + r * 7 + int(i)) + (r == 1 ? 1e7f : 0.0f); };
    float f[4];
    double d[4];
    for (std::size_t i = 0; i < 4; ++i) f[i] = value(me, i), d[i] = double(value(me, i));
    c.allreduce_sum(f, 4, "sum_f");
    c.allreduce_sum(d, 4, "sum_d");
    for (std::size_t i = 0; i < 4; ++i) {
      float ef = value(0, i);
      double ed = double(value(0, i));
      for (int r = 1; r < n; ++r) ef += value(r, i), ed += double(value(r, i));
      EXPECT_EQ(f[i], ef);  // exactly: rank order
      EXPECT_EQ(d[i], ed);
    }
    EXPECT_EQ(sent(c, "sum_f"), 16);  // the base class's count: the buffer once, as for MPI
    std::int64_t lo[2] = {me, -me}, hi[2] = {me, -me};
    c.allreduce_min(lo, 2);
    c.allreduce_max(hi, 2);
    EXPECT_EQ(lo[0], 0);
    EXPECT_EQ(lo[1], -(n - 1));
    EXPECT_EQ(hi[0], n - 1);
    EXPECT_EQ(hi[1], 0);
    double m = 0.5 * me;
    c.allreduce_max(&m, 1);
    EXPECT_EQ(m, 0.5 * (n - 1));
    // reduce_scatter: block j (j + 1 floats) summed over ranks lands on rank j.
    std::vector<std::size_t> counts(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j) counts[std::size_t(j)] = std::size_t(j + 1);
    std::vector<float> send(std::size_t(n * (n + 1) / 2)), recv(std::size_t(me + 1));
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = float(me + 1) * float(i);
    c.reduce_scatter_sum(send, recv, counts, "rsv");
    const std::size_t off = std::size_t(me * (me + 1) / 2);
    for (std::size_t i = 0; i < recv.size(); ++i) EXPECT_EQ(recv[i], float(n * (n + 1) / 2) * float(off + i));
    EXPECT_EQ(sent(c, "rsv"), std::int64_t(4 * (send.size() - recv.size())));
    std::vector<float> sb(std::size_t(2 * n), float(me)), rb(2);
    c.reduce_scatter_sum(sb.data(), rb.data(), 2, "rs");
    EXPECT_EQ(rb[1], float(n * (n - 1) / 2));
    EXPECT_EQ(sent(c, "rs"), 8 * (n - 1));
  });
}

TEST(Local, PointToPointMatchesBySourceAndTagInPostingOrder) {
  run_local(2, [](Communicator& c) {
    if (c.rank() == 0) {
      std::int32_t a[4] = {10, 20, 11, 21};  // tags 1, 2, 1, 2
      std::vector<Request> r;
      for (int i = 0; i < 4; ++i) r.push_back(c.isend({&a[i], 4}, 1, 1 + i % 2, "p2p"));
      for (Request& q : r) q.wait();
      EXPECT_EQ(sent(c, "p2p"), 16);
      EXPECT_EQ(c.counters().at("p2p").messages, 4);
    } else {
      std::int32_t t2a = 0, t1a = 0, t2b = 0, t1b[2] = {0, 0};  // a buffer larger than its message is fine
      Request r2a = c.irecv({&t2a, 4}, 0, 2), r1a = c.irecv({&t1a, 4}, 0, 1), r2b = c.irecv({&t2b, 4}, 0, 2);
      Request r1b = c.irecv({t1b, 8}, 0, 1);
      for (Request* q : {&r2a, &r1a, &r2b, &r1b}) q->wait();
      EXPECT_EQ(t1a, 10);
      EXPECT_EQ(t1b[0], 11);
      EXPECT_EQ(t2a, 20);
      EXPECT_EQ(t2b, 21);
    }
    // A small send completes before its receive is posted (MPI's eager protocol), so waiting
    // for it first cannot deadlock; too large for its receive buffer, it fails the receive.
    std::int64_t big = 5;
    std::int32_t small = 0;
    if (c.rank() == 0) c.isend({&big, 8}, 1, 9).wait();
    c.barrier();
    if (c.rank() == 1) EXPECT_THROW(c.irecv({&small, 4}, 0, 9).wait(), Error);
  });
}

TEST(Local, SplitMakesOrderedGroupsSharingTheWatchdog) {
  run_local(4, [](Communicator& c) {
    c.set_timeout(77);
    std::unique_ptr<Communicator> sub = c.split(c.rank() % 2, -c.rank());  // reversed within a color
    EXPECT_EQ(sub->size(), 2);
    EXPECT_EQ(sub->rank(), c.rank() < 2 ? 1 : 0);
    EXPECT_STREQ(sub->backend(), "local");
    EXPECT_EQ(sub->timeout(), 77);
    EXPECT_EQ(sub->ranks_on_this_node(), 2);
    std::int64_t v = c.rank();
    sub->allreduce_max(&v, 1);
    EXPECT_EQ(v, c.rank() % 2 == 0 ? 2 : 3);
    const std::unique_ptr<Communicator> dup = make_communicator("local");  // the rank's world, again
    EXPECT_EQ(dup->size(), 4);
    EXPECT_EQ(dup->rank(), c.rank());
    EXPECT_EQ(make_self_communicator(c)->size(), 1);
  });
}

TEST(Local, EachRankGetsItsShareOfTheThreads) {
  const int caller = omp_get_max_threads();
  run_local(3, [&](Communicator&) { EXPECT_EQ(omp_get_max_threads(), std::max(1, caller / 3)); });
}

TEST(Local, TracesAndClockWorkAsOverMpi) {
  run_local(2, [](Communicator& c) {
    const double t0 = c.now();
    std::vector<TraceEvent> events;
    {
      Tracer tracer(c);
      c.barrier();
      std::int64_t v = 1;
      c.allreduce_min(&v, 1);
      events = tracer.events();
    }
    EXPECT_GE(c.now(), t0);
    ASSERT_GE(events.size(), 2u);
    EXPECT_EQ(events[events.size() - 2].name, "barrier");
  });
}

TEST(Local, ARankThatThrowsReleasesTheOthersAndIsRethrown) {
  for (int n = 2; n <= 4; ++n) {
    std::vector<std::string> released(static_cast<std::size_t>(n));
    try {
      run_local(n, [&](Communicator& c) {
        if (c.rank() == 1) throw std::runtime_error("boom");
        try {
          c.barrier();  // rank 1 never comes
        } catch (const Error& e) {
          released[std::size_t(c.rank())] = e.what();
          throw;
        }
      });
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "boom");  // rank 1's own, not a released rank's
    }
    for (int r = 0; r < n; ++r)
      if (r != 1)
        EXPECT_NE(released[std::size_t(r)].find("rank 1 of the local world failed: boom"), std::string::npos)
            << released[std::size_t(r)];
  }
}

TEST(Local, TheWatchdogEndsAHungGroupWithItsLine) {
  std::atomic<int> released{0};
  try {
    run_local(3, [&](Communicator& c) {
      c.set_timeout(0.2);
      const WatchdogStep step(c, "step 3");
      if (c.rank() == 2) {  // skips the barrier but stays (a rank that returned would fail the group at once)
        while (released.load() < 2) std::this_thread::yield();
        return;
      }
      try {
        c.barrier();
      } catch (const Error&) {
        ++released;
        throw;
      }
    });
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ulysses watchdog: local rank "), std::string::npos) << m;
    EXPECT_NE(m.find("for barrier on the local group of 3 ranks"), std::string::npos) << m;
    EXPECT_NE(m.find("during step 3"), std::string::npos) << m;
  }
}

TEST(Local, ARankThatReturnsWhileOthersWaitForItEndsTheGroupNamingIt) {
  for (int n = 2; n <= 4; ++n) {
    std::vector<std::string> released(static_cast<std::size_t>(n));
    try {
      run_local(n, [&](Communicator& c) {
        if (c.rank() == n - 1) return;  // leaves; the default deadline is 1800 s
        try {
          c.barrier();
        } catch (const Error& e) {
          released[std::size_t(c.rank())] = e.what();
          throw;
        }
      });
      ADD_FAILURE() << "no exception";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("rank {} of the local world failed: it returned from its "
                                                       "function while local rank",
                                                       n - 1)),
                std::string::npos)
          << e.what();
    }
    for (int r = 0; r + 1 < n; ++r)
      EXPECT_NE(released[std::size_t(r)].find(fmt::format("rank {} of the local world failed", n - 1)),
                std::string::npos)
          << released[std::size_t(r)];
  }
  // A message from a rank that left: its receiver fails too; one that leaves after the others'
  // last call is fine.
  EXPECT_THROW(run_local(2,
                         [](Communicator& c) {
                           if (c.rank() == 0) return;
                           std::vector<char> buf(1 << 20);
                           c.irecv(buf, 0, 3).wait();
                         }),
               Error);
  EXPECT_NO_THROW(run_local(3, [](Communicator& c) {
    const std::unique_ptr<Communicator> mine = c.split(c.rank() == 0 ? 0 : 1, c.rank());
    if (c.rank() == 0) return;  // not in the others' group
    mine->barrier();
  }));
}

TEST(Local, ACommunicatorKeptAfterItsRunThrowsOnUse) {
  std::vector<std::shared_ptr<Communicator>> kept(2);
  run_local_shared(2, [&](const std::shared_ptr<Communicator>& c) { kept[std::size_t(c->rank())] = c; });
  for (const auto& c : kept) {
    EXPECT_EQ(c->size(), 2);
    try {
      c->barrier();
      ADD_FAILURE() << "no exception";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the local group of 2 ranks has ended"), std::string::npos) << e.what();
    }
    int x = 0;
    EXPECT_THROW(c->isend({&x, sizeof(x)}, 0, 1), Error);
    EXPECT_THROW(c->split(0, 0), Error);
  }
}

TEST(Local, CollectivesOutOfOrderAndBadArgumentsAreErrors) {
  try {
    run_local(2, [](Communicator& c) {
      if (c.rank() == 0) {
        c.barrier();
      } else {
        std::int64_t v = 0;
        c.allreduce_min(&v, 1);
      }
    });
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("collectives out of order"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run_local(2,
                         [](Communicator& c) {
                           std::int64_t v = 0;
                           c.allreduce_min(&v, c.rank() == 0 ? 1 : 2);  // lengths differ
                         }),
               Error);
  EXPECT_THROW(run_local(0, [](Communicator&) {}), Error);
  EXPECT_THROW(make_communicator("nccl"), Error);
  LocalCommunicator alone;
  EXPECT_THROW(alone.split(-1, 0), Error);
  EXPECT_THROW(alone.isend({nullptr, 0}, 1, 0), Error);
  EXPECT_EQ(alone.size(), 1);
}

// A backend is registered like a strategy: make_communicator and the list of names see it, and
// a taken name or a missing maker is refused (the new backend wraps the local one).
TEST(Local, BackendsAreRegisteredByName) {
  static const bool registered = [] {  // once per process, whatever --gtest_repeat says
    register_communicator_backend({"local-again", [] { return make_communicator("local"); },
                                   [] { return std::make_unique<LocalCommunicator>(); }});
    return true;
  }();
  ASSERT_TRUE(registered);
  const std::vector<std::string> names = communicator_backends();
  EXPECT_EQ(names.front(), "mpi");
  EXPECT_EQ(names.back(), "local-again");
  EXPECT_EQ(make_communicator("local-again")->size(), 1);
  run_local(2, [](Communicator& c) {
    const std::unique_ptr<Communicator> world = make_communicator("local-again");  // this rank's world again
    EXPECT_EQ(world->size(), 2);
    EXPECT_EQ(world->rank(), c.rank());
  });
  EXPECT_EQ(make_self_communicator(LocalCommunicator())->size(), 1);
  EXPECT_NE(error_of([] {
              register_communicator_backend(
                  {"local", [] { return make_communicator("local"); }, [] { return make_communicator("local"); }});
            }).find("'local' is already registered"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              register_communicator_backend({"half", [] { return make_communicator("local"); }, {}});
            }).find("needs both its makers"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_communicator("nccl"); }).find("known: mpi, local, local-again"), std::string::npos);
}

}  // namespace
