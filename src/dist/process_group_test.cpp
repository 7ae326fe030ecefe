#include "dist/process_group.h"

#include <gtest/gtest.h>

namespace lathe {
namespace {

// The launcher and the four rank fields of a group read from the environment.
void expect_ranks(const ProcessGroupInfo& g, Launcher launcher, int rank, int world_size,
                  int local_rank, int local_world_size) {
    SCOPED_TRACE(g.describe());
    EXPECT_EQ(g.launcher, launcher);
    EXPECT_EQ(g.rank, rank);
    EXPECT_EQ(g.world_size, world_size);
    EXPECT_EQ(g.local_rank, local_rank);
    EXPECT_EQ(g.local_world_size, local_world_size);
}

TEST(ProcessGroup, NoLauncherIsOneProcess) {
    auto g = process_group_from_env({{"HOME", "/root"}, {"PATH", "/bin"}});
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    expect_ranks(*g, Launcher::kNone, 0, 1, 0, 0);
    EXPECT_TRUE(g->single_process());
    EXPECT_EQ(g->master_port, 0);
    EXPECT_EQ(g->describe(), "a single process (no launcher)");
}

TEST(ProcessGroup, Torchrun) {
    auto g = process_group_from_env({{"RANK", "5"},
                                     {"WORLD_SIZE", "8"},
                                     {"LOCAL_RANK", "1"},
                                     {"LOCAL_WORLD_SIZE", "4"},
                                     {"MASTER_ADDR", "node-a"},
                                     {"MASTER_PORT", "29500"}});
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    expect_ranks(*g, Launcher::kTorchrun, 5, 8, 1, 4);
    EXPECT_EQ(g->master_addr, "node-a");
    EXPECT_EQ(g->master_port, 29500);
    EXPECT_EQ(g->describe(), "rank 5 of 8 (local rank 1, torchrun)");
}

TEST(ProcessGroup, SlurmAndOpenMpi) {
    auto s = process_group_from_env(
        {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "3"}});
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    expect_ranks(*s, Launcher::kSlurm, 3, 4, 3, 0);  // srun's per-node count is not read

    auto m = process_group_from_env({{"OMPI_COMM_WORLD_RANK", "1"},
                                     {"OMPI_COMM_WORLD_SIZE", "2"},
                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    expect_ranks(*m, Launcher::kMpirun, 1, 2, 1, 2);
}

// A launcher inside another's allocation: its own variables win (torchrun, then mpirun, then srun).
TEST(ProcessGroup, InnerLauncherWins) {
    auto g = process_group_from_env({{"SLURM_PROCID", "0"},
                                     {"SLURM_NTASKS", "1"},
                                     {"SLURM_LOCALID", "0"},
                                     {"OMPI_COMM_WORLD_RANK", "2"},
                                     {"OMPI_COMM_WORLD_SIZE", "4"},
                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    EXPECT_EQ(g->launcher, Launcher::kMpirun);
    EXPECT_EQ(g->rank, 2);
    auto t = process_group_from_env({{"SLURM_PROCID", "0"},
                                     {"SLURM_NTASKS", "1"},
                                     {"RANK", "3"},
                                     {"WORLD_SIZE", "4"},
                                     {"LOCAL_RANK", "3"}});
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ(t->launcher, Launcher::kTorchrun);
    EXPECT_EQ(t->world_size, 4);
}

TEST(ProcessGroup, OneProcessNeedsNoLocalRank) {
    auto g = process_group_from_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    EXPECT_EQ(g->launcher, Launcher::kTorchrun);
    EXPECT_TRUE(g->single_process());
}

// Each inconsistency is an error naming the variable.
TEST(ProcessGroup, InconsistentValuesNameTheVariable) {
    const std::pair<EnvMap, std::string> cases[] = {
        {{{"RANK", "0"}}, "RANK is set but WORLD_SIZE is not"},
        {{{"WORLD_SIZE", "2"}}, "WORLD_SIZE is set but RANK is not"},
        {{{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK='x' is not a whole number"},
        {{{"RANK", "1 "}, {"WORLD_SIZE", "2"}}, "RANK='1 ' is not a whole number"},
        {{{"RANK", ""}, {"WORLD_SIZE", "2"}}, "RANK='' is not a whole number"},
        {{{"RANK", "99999999999"}, {"WORLD_SIZE", "2"}}, "RANK='99999999999' is not a whole"},
        {{{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}},
         "RANK=2 is outside [0, 2) given by WORLD_SIZE=2"},
        {{{"RANK", "-1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}, "RANK=-1 is outside"},
        {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE=0: a world needs at least one"},
        {{{"RANK", "1"}, {"WORLD_SIZE", "2"}}, "LOCAL_RANK is not set"},
        {{{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}},
         "LOCAL_RANK=2 is outside [0, 1]"},
        {{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
         "LOCAL_RANK=2 is outside [0, 2) given by LOCAL_WORLD_SIZE=2"},
        {{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "8"}},
         "LOCAL_WORLD_SIZE=8 is outside [1, 4]"},
        {{{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}},
         "SLURM_PROCID=4 is outside [0, 4) given by SLURM_NTASKS=4"},
        {{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}}, "SLURM_LOCALID is not set"},
        {{{"OMPI_COMM_WORLD_RANK", "0"}}, "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE"},
        {{{"OMPI_COMM_WORLD_RANK", "0"},
          {"OMPI_COMM_WORLD_SIZE", "2"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", "z"}},
         "OMPI_COMM_WORLD_LOCAL_RANK='z'"},
        {{{"MASTER_PORT", "70000"}}, "MASTER_PORT=70000 is not a TCP port"},
        {{{"MASTER_PORT", "http"}}, "MASTER_PORT='http' is not a whole number"},
    };
    for (const auto& [env, needle] : cases) {
        auto g = process_group_from_env(env);
        ASSERT_FALSE(g.ok()) << needle;
        EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument) << needle;
        EXPECT_NE(g.status().message().find(needle), std::string::npos)
            << "want '" << needle << "' in: " << g.status().message();
    }
}

TEST(ProcessGroup, ProcessEnvironmentReadsEnviron) {
    ::setenv("LATHE_DIST_TEST_VAR", "a=b", 1);
    const EnvMap env = process_environment();
    ::unsetenv("LATHE_DIST_TEST_VAR");
    const auto it = env.find("LATHE_DIST_TEST_VAR");
    ASSERT_NE(it, env.end());
    EXPECT_EQ(it->second, "a=b");  // split at the first '='
}

}  // namespace
}  // namespace lathe
