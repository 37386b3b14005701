// The SMPI simulator (sim/simulate.cpp) and `tessera bench scale`: the strategies' exchange code on a simulated
// star of 8 hosts (tests/data/sim/star.xml: 1 GB/s and 10 us per link, a message crosses two links). Checked
// against what can be worked out by hand: the bytes each strategy sends, the time of Rabenseifner's allreduce on
// that network, and the payload-scaling rule bench scale relies on. Times here are simulated, not measured.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::contains;

// tests/data/sim/two-tensors.layout: two parameters of 250,000 values and a buffer of 1,000.
constexpr double kValues = 501000;  // parameters and buffers: what easgd's exchange carries
constexpr double kLinkLatency = 10e-6;
constexpr double kLinkBandwidth = 1e9;

std::string data(const std::string& name) { return (testing::test_data_dir() / "sim" / name).string(); }

std::string hostfile(const testing::TempDir& dir, int ranks) {
  const std::string path = dir.file("hosts");
  std::ofstream f(path);
  for (int r = 0; r < ranks; ++r) f << "h-" << r << "\n";
  return path;
}

// One smpirun of the simulator; its JSON line (null when it printed none).
struct Sim {
  testing::Run run;
  json result;
};

Sim simulate(const testing::TempDir& dir, int ranks, const std::string& platform, const std::string& flags,
             const std::string& smpi = "") {
  Sim s;
  s.run = testing::run_script(
      "smpirun -np " + std::to_string(ranks) + " -platform " + platform + " -hostfile " + hostfile(dir, ranks) +
      " --cfg=smpi/privatization:no --cfg=smpi/simulate-computation:no --cfg=smpi/coll-selector:ompi"
      " --cfg=smpi/allreduce:rab_rdb --cfg=smpi/bw-factor:0:1 --cfg=smpi/lat-factor:0:1 --log=root.thresh:warning " +
      smpi + " " + std::string(TESSERA_SIMULATOR) + " --layout " + data("two-tensors.layout") + " " + flags);
  std::istringstream lines(s.run.out);
  const std::string prefix = "tessera-simulate: ";
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(prefix, 0) == 0) s.result = json::parse(line.substr(prefix.size()));
  }
  return s;
}

TEST(Simulator, EasgdSendsItsCentreEveryTauStepsAndComputesWhatItIsTold) {
  testing::TempDir dir;
  const Sim s = simulate(dir, 4, data("star.xml"), "--strategy easgd --tau 2 --steps 4 --compute 0.01");
  ASSERT_EQ(s.run.code, 0) << s.run.out << s.run.err;
  ASSERT_TRUE(s.result.is_object()) << s.run.out;
  EXPECT_EQ(s.result["ranks"], 4);
  EXPECT_EQ(s.result["params"], 501000);
  // Two exchanges in four steps, each one allreduce of parameters and buffers (4 bytes each).
  EXPECT_NEAR(s.result["mb_per_step"].get<double>(), 2 * 4 * kValues / 4 / 1e6, 1e-9);
  EXPECT_GT(s.result["step_s"].get<double>(), 0.01);
  EXPECT_LT(s.result["efficiency"].get<double>(), 1.0);
  EXPECT_GT(s.result["comm_fraction"].get<double>(), 0.0);
}

TEST(Simulator, AllreduceTakesRabenseifnersTimeOnTheStar) {
  // easgd with tau 1 and no computation: every step is one allreduce of n bytes, after a barrier. On p = 4 ranks
  // reduce-scatter and allgather take log2(p) rounds each, every rank sending (p-1)/p n bytes in each phase;
  // a round costs the two links' latencies.
  testing::TempDir dir;
  const Sim s = simulate(dir, 4, data("star.xml"), "--strategy easgd --tau 1 --steps 2 --compute 0");
  ASSERT_EQ(s.run.code, 0) << s.run.out << s.run.err;
  const double n = 4 * kValues;
  const double rounds = 2 * 2;
  const double by_hand = rounds * 2 * kLinkLatency + 2 * 0.75 * n / kLinkBandwidth;
  const double comm = s.result["comm_s"].get<double>();
  EXPECT_NEAR(comm / by_hand, 1.0, 0.1) << "simulated " << comm << " s, by hand " << by_hand << " s";
  // The barrier before it (the strategies' wait accounting) is small against it.
  EXPECT_LT(s.result["wait_s"].get<double>(), 0.1 * comm);
}

TEST(Simulator, ShrinkingPayloadAndBandwidthTogetherKeepsTheStepTime) {
  // What bench scale does for large models: every tensor 8 times smaller on links 8 times slower.
  testing::TempDir dir;
  const std::string slow = dir.file("star-slow.xml");
  {
    std::ifstream in(data("star.xml"));
    std::stringstream text;
    text << in.rdbuf();
    std::string xml = text.str();
    const auto at = xml.find("bw=\"1GBps\"");
    ASSERT_NE(at, std::string::npos);
    xml.replace(at, 10, "bw=\"0.125GBps\"");
    std::ofstream(slow) << xml;
  }
  for (const std::string strategy : {"allreduce", "easgd", "async-easgd"}) {
    const std::string flags = "--strategy " + strategy + " --tau 1 --steps 2 --compute 0.001";
    const Sim full = simulate(dir, 4, data("star.xml"), flags);
    // As bench scale runs it: the eager threshold shrinks with the payload (64 KiB / 8).
    const Sim shrunk = simulate(dir, 4, slow, flags + " --payload-scale 8", "--cfg=smpi/send-is-detached-thresh:8192");
    ASSERT_EQ(full.run.code, 0) << full.run.err;
    ASSERT_EQ(shrunk.run.code, 0) << shrunk.run.err;
    // async-easgd's ranks queue for exclusive locks on the centre's shards, in an order that sub-microsecond
    // differences decide (they come from the eager messages of lock and unlock, which are not shrunk): with four
    // ranks and almost no computation its step time moves by some percent (6% here); the synchronous ones' not.
    const double tolerance = strategy == "async-easgd" ? 0.1 : 0.03;
    EXPECT_NEAR(shrunk.result["step_s"].get<double>() / full.result["step_s"].get<double>(), 1.0, tolerance)
        << strategy;
    // Bytes are reported at the model's full size.
    EXPECT_NEAR(shrunk.result["mb_per_step"].get<double>() / full.result["mb_per_step"].get<double>(), 1.0, 1e-3)
        << strategy;
  }
}

TEST(Simulator, TheCentralServerReceivesEveryWorkersReplica) {
  // 3 workers and the server: each worker sends its parameters and buffers every tau steps and gets the centre back;
  // the server's link carries all of them, one after another, so the decentralized easgd is faster.
  testing::TempDir dir;
  const Sim central = simulate(dir, 4, data("star.xml"), "--strategy central-easgd --tau 2 --steps 4 --compute 0.001");
  ASSERT_EQ(central.run.code, 0) << central.run.out << central.run.err;
  EXPECT_EQ(central.result["trainers"], 3);
  EXPECT_NEAR(central.result["mb_per_step"].get<double>(), 2 * 4 * kValues / 4 / 1e6, 1e-9);
  const Sim easgd = simulate(dir, 3, data("star.xml"), "--strategy easgd --tau 2 --steps 4 --compute 0.001");
  ASSERT_EQ(easgd.run.code, 0) << easgd.run.err;
  EXPECT_GT(central.result["comm_s"].get<double>(), easgd.result["comm_s"].get<double>());
}

TEST(Simulator, ACheckpointWrittenInParallelCostsEachRankOneReplica) {
  // After the steps, one checkpoint, written both ways. With SGD momentum (one optimizer slot) a replica is
  // 4 · (2 · 500,000 + 1,000) bytes and the checkpoint rank 0 writes beside it 4 · (3 · 500,000 + 2 · 1,000) (the
  // centre twice, its momentum, the buffers twice: /buffers and /easgd/center_buffers); storage at 100 MB/s per rank.
  const double replica = 4.0 * (2 * 500000 + 1000);
  const double index_bytes = 4.0 * (3 * 500000 + 2 * 1000);
  const double disk = 100e6;
  testing::TempDir dir;
  json results[2];
  const int ranks[2] = {4, 8};
  for (int i = 0; i < 2; ++i) {
    const Sim s =
        simulate(dir, ranks[i], data("star.xml"), "--strategy easgd --tau 1 --steps 1 --compute 0 --disk-mbps 100");
    ASSERT_EQ(s.run.code, 0) << s.run.out << s.run.err;
    results[i] = s.result;
    const double p = ranks[i];
    // In parallel: every rank its replica at once, then rank 0 the checkpoint (and a gather of 8 bytes a rank).
    EXPECT_NEAR(s.result["ckpt_parallel_s"].get<double>(), (replica + index_bytes) / disk,
                0.01 * (replica + index_bytes) / disk);
    EXPECT_NEAR(s.result["ckpt_rank_mb"].get<double>(), (replica + index_bytes) / 1e6, 1e-6);
    // Gathered: the other ranks' replicas over rank 0's link (1 GB/s), then rank 0 writes them all.
    const double gathered = (p - 1) * replica / kLinkBandwidth + (p * replica + index_bytes) / disk;
    EXPECT_NEAR(s.result["ckpt_gathered_s"].get<double>(), gathered, 0.03 * gathered);
    EXPECT_NEAR(s.result["ckpt_root_mb_gathered"].get<double>(), (p * replica + index_bytes) / 1e6, 1e-6);
  }
  // Flat in the rank count written in parallel, growing with it gathered.
  EXPECT_EQ(results[0]["ckpt_rank_mb"], results[1]["ckpt_rank_mb"]);
  EXPECT_NEAR(results[1]["ckpt_parallel_s"].get<double>(), results[0]["ckpt_parallel_s"].get<double>(), 1e-3);
  EXPECT_GT(results[1]["ckpt_gathered_s"].get<double>(), 1.9 * results[0]["ckpt_gathered_s"].get<double>() - 0.1);

  // A shared file system of 0.2 GB/s in all: 8 ranks writing at once get 25 MB/s each.
  const Sim shared = simulate(dir, 8, data("star.xml"),
                              "--strategy easgd --tau 1 --steps 1 --compute 0 --disk-mbps 100 --fs-gbps 0.2");
  ASSERT_EQ(shared.run.code, 0) << shared.run.err;
  const double by_hand = replica / 25e6 + index_bytes / disk;
  EXPECT_NEAR(shared.result["ckpt_parallel_s"].get<double>(), by_hand, 0.01 * by_hand);

  // allreduce keeps no replicas: both ways, rank 0 writes the model and its momentum.
  const Sim allreduce =
      simulate(dir, 4, data("star.xml"), "--strategy allreduce --steps 1 --compute 0 --disk-mbps 100");
  ASSERT_EQ(allreduce.run.code, 0) << allreduce.run.err;
  EXPECT_EQ(allreduce.result["ckpt_parallel_s"], allreduce.result["ckpt_gathered_s"]);
  EXPECT_NEAR(allreduce.result["ckpt_rank_mb"].get<double>(), replica / 1e6, 1e-6);
}

TEST(Simulator, ABadLayoutOrFlagIsOneErrorNamingIt) {
  testing::TempDir dir;
  const Sim unknown = simulate(dir, 2, data("star.xml"), "--strategy easgd --colour blue");
  EXPECT_EQ(unknown.run.code, 2);
  EXPECT_TRUE(unknown.result.is_null());
  EXPECT_TRUE(contains(unknown.run.err, "unknown flag --colour")) << unknown.run.err;
  const Sim strategy = simulate(dir, 2, data("star.xml"), "--strategy gossip");
  EXPECT_EQ(strategy.run.code, 2);
  EXPECT_TRUE(strategy.result.is_null());
  EXPECT_TRUE(contains(strategy.run.err, "gossip")) << strategy.run.err;
  EXPECT_TRUE(contains(strategy.run.err, "easgd")) << strategy.run.err;  // the known names are listed
}

TEST(BenchScale, SweepsRanksAndStrategiesIntoATableAndPlots) {
  testing::TempDir dir;
  const std::string out = dir.file("scale");
  const auto r = testing::run("bench scale --platforms " + data("star.xml") +
                              " --ranks 2,4 --models compact --sizes compact=32 --compute compact=0.02 --no-validate"
                              " --steps 4 --tau 2 --tau-sweep 1 --tau-sweep-ranks 4 --ranks-per-node 1"
                              " --strategies allreduce,easgd,central-easgd --payload-kb 64 --out " +
                              out);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "SIMULATED")) << r.out;
  std::ifstream csv(out + "/scale.csv");
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header.rfind("simulated,platform,model", 0), 0u) << header;
  EXPECT_TRUE(contains(header, ",ckpt_parallel_s,ckpt_gathered_s,ckpt_rank_mb,ckpt_root_mb_gathered,")) << header;
  EXPECT_TRUE(contains(r.out, "ckpt s parallel/gath.")) << r.out;
  int rows = 0;
  for (std::string line; std::getline(csv, line);) {
    ++rows;
    EXPECT_EQ(line.rfind("yes,star,compact,", 0), 0u) << line;
    EXPECT_EQ(line.back(), ',') << "a failure is recorded: " << line;
  }
  EXPECT_EQ(rows, 3 * 2 + 1);  // three strategies at two rank counts, and easgd's tau 1 at 4 ranks
  EXPECT_TRUE(fs::exists(out + "/efficiency-star-compact.png"));
  EXPECT_TRUE(fs::exists(out + "/comm-star-compact.png"));
  const json report = json::parse(std::ifstream(out + "/scale.json"));
  EXPECT_TRUE(report["simulated"].get<bool>());
  EXPECT_EQ(report["calibration"][0]["compute_s"], 0.02);
}

// `bench scale --measured`: a `bench comm` report from 2 hosts (here a small one written by hand: the figures are
// inputs, not results) is simulated on 2 hosts, the link from its allreduce sweep, and every strategy row but the
// bucketed allreduce (not simulated) is compared with it.
TEST(BenchScale, MeasuredReportIsSimulatedOnItsHosts) {
  testing::TempDir dir;
  const json bandwidth = json::array({{{"bytes", 4096}, {"seconds", 50e-6}},
                                      {{"bytes", 1 << 20}, {"seconds", 1.0e-3}},
                                      {{"bytes", 4 << 20}, {"seconds", 3.85e-3}},
                                      {{"bytes", 16 << 20}, {"seconds", 20e-3}}});
  auto row = [](const std::string& label, const std::string& strategy, json options) {
    return json{{"label", label}, {"strategy", strategy}, {"options", std::move(options)}, {"step_s", 0.06}};
  };
  const json report = {{"bench", "comm"},
                       {"ranks", 2},
                       {"hosts", 2},
                       {"model", "tiny_cnn"},
                       {"size", 32},
                       {"batch", 4},
                       {"steps", 4},
                       {"cpu", "test"},
                       {"launcher", "testhosts"},
                       {"load_average", {{"start", "0"}, {"end", "0"}}},
                       {"bandwidth", bandwidth},
                       {"no_exchange", {{"step_s", 0.05}}},
                       {"strategies", json::array({row("allreduce, fused", "allreduce", {{"bucket_mb", 0.0}}),
                                                   row("allreduce, buckets", "allreduce", {{"bucket_mb", 25.0}}),
                                                   row("easgd, tau 2", "easgd", {{"tau", 2}})})}};
  const std::string file = dir.file("comm.json");
  std::ofstream(file) << report.dump();
  const std::string out = dir.file("scale");
  const auto r = testing::run("bench scale --measured " + file + " --out " + out);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "validation: 2 ranks on 2 hosts")) << r.out;
  const json scale = json::parse(std::ifstream(out + "/scale.json"));
  const json& v = scale["validation"];
  EXPECT_EQ(v["platform"]["hosts"], 2);
  EXPECT_EQ(v["platform"]["ranks_per_host"], 1);
  // 4 KB to 4 MB: (4 MiB - 4 KiB) bytes in 3.8 ms more; the 4 KB call's rest is 2 messages over 2 links each.
  const double per_byte = (3.85e-3 - 50e-6) / ((4 << 20) - 4096);
  EXPECT_NEAR(v["platform"]["bandwidth_Bps"].get<double>(), 1.0 / per_byte, 1e-6 / per_byte);
  EXPECT_NEAR(v["platform"]["latency_s"].get<double>(), (50e-6 - 4096 * per_byte) / 4, 1e-12);
  EXPECT_EQ(v["compute_step_s"], 0.05);
  ASSERT_EQ(v["rows"].size(), 2u) << v.dump(2);  // the bucketed row is not simulated
  for (const auto& simulated : v["rows"]) {
    EXPECT_FALSE(simulated.contains("failure")) << simulated.dump();
    EXPECT_GT(simulated["simulated_step_s"].get<double>(), 0.05) << "computation plus an exchange";
    EXPECT_EQ(simulated["measured_step_s"], 0.06);
  }
  std::ifstream platform(out + "/work/measured-hosts.xml");
  const std::string xml((std::istreambuf_iterator<char>(platform)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(xml, "radical=\"0-1\"")) << xml;
  EXPECT_TRUE(contains(xml, "SPLITDUPLEX")) << xml;

  std::ofstream(dir.file("not-comm.json")) << R"({"bench": "scale"})";
  const auto bad = testing::run("bench scale --measured " + dir.file("not-comm.json") + " --out " + out);
  EXPECT_NE(bad.code, 0);
  EXPECT_TRUE(contains(bad.err, "not-comm.json")) << bad.err;
  EXPECT_TRUE(contains(bad.err, "bench comm")) << bad.err;
}

}  // namespace
}  // namespace tessera
