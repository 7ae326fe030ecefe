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
    // The step's task count, not SLURM_NTASKS (the allocation's under `srun -E`).
    auto s = process_group_from_env({{"SLURM_PROCID", "3"},
                                     {"SLURM_STEP_NUM_TASKS", "4"},
                                     {"SLURM_NTASKS", "8"},
                                     {"SLURM_LOCALID", "3"},
                                     {"SLURM_STEP_TASKS_PER_NODE", "4"}});
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
                                     {"SLURM_STEP_NUM_TASKS", "1"},
                                     {"SLURM_LOCALID", "0"},
                                     {"OMPI_COMM_WORLD_RANK", "2"},
                                     {"OMPI_COMM_WORLD_SIZE", "4"},
                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    EXPECT_EQ(g->launcher, Launcher::kMpirun);
    EXPECT_EQ(g->rank, 2);
    auto t = process_group_from_env({{"SLURM_PROCID", "0"},
                                     {"SLURM_STEP_NUM_TASKS", "1"},
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
        {{{"SLURM_PROCID", "4"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_LOCALID", "0"}},
         "SLURM_PROCID=4 is outside [0, 4) given by SLURM_STEP_NUM_TASKS=4"},
        {{{"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "4"}}, "SLURM_LOCALID is not set"},
        {{{"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_LOCALID", "0"}},
         "SLURM_STEP_NUM_TASKS is set but SLURM_PROCID is not"},
        {{{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "four"}, {"SLURM_LOCALID", "0"}},
         "SLURM_STEP_NUM_TASKS='four' is not a whole number"},
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

// `lathe launch` sets torchrun's variables and LATHE_LAUNCHER=launch.
TEST(ProcessGroup, LatheLaunch) {
    auto g = process_group_from_env({{"RANK", "1"},
                                     {"WORLD_SIZE", "3"},
                                     {"LOCAL_RANK", "1"},
                                     {"LOCAL_WORLD_SIZE", "3"},
                                     {"MASTER_ADDR", "127.0.0.1"},
                                     {"MASTER_PORT", "40123"},
                                     {"LATHE_LAUNCHER", "launch"}});
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    expect_ranks(*g, Launcher::kLaunch, 1, 3, 1, 3);
    EXPECT_EQ(g->master_port, 40123);
    EXPECT_EQ(g->describe(), "rank 1 of 3 (local rank 1, lathe launch)");

    const std::pair<EnvMap, std::string> bad[] = {
        {{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LATHE_LAUNCHER", "torchrun"}},
         "LATHE_LAUNCHER='torchrun' is not a launcher lathe knows"},
        {{{"LATHE_LAUNCHER", "launch"}}, "LATHE_LAUNCHER=launch is set but RANK and WORLD_SIZE"},
        {{{"OMPI_COMM_WORLD_RANK", "0"},
          {"OMPI_COMM_WORLD_SIZE", "1"},
          {"LATHE_LAUNCHER", "launch"}},
         "LATHE_LAUNCHER=launch is set but RANK"},
    };
    for (const auto& [env, needle] : bad) {
        auto e = process_group_from_env(env);
        ASSERT_FALSE(e.ok()) << needle;
        EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << needle;
        EXPECT_NE(e.status().message().find(needle), std::string::npos)
            << "want '" << needle << "' in: " << e.status().message();
    }
}

TEST(SlurmHostList, FirstHost) {
    const std::pair<std::string, std::string> cases[] = {
        {"node1", "node1"},
        {"node1,node2", "node1"},
        {"gpu[001-004,010],login1", "gpu001"},
        {"gpu[010,001-004]", "gpu010"},  // as written: the first number, not the smallest
        {"a[1-2]-ib", "a1-ib"},
        {"r[1-2]n[08-09]", "r1n08"},
        {"login1,gpu[001-004]", "login1"},
        {"gpu[7]", "gpu7"},
        {"[3-5]x", "3x"},
        {"n-01.cluster,n-02.cluster", "n-01.cluster"},
        {"gpu[0009-0010]", "gpu0009"},
        {"big[99999999999999999999-199999999999999999999]", "big99999999999999999999"},
    };
    for (const auto& [list, want] : cases) {
        auto got = slurm_first_host(list);
        ASSERT_TRUE(got.ok()) << list << ": " << got.status().to_string();
        EXPECT_EQ(*got, want) << list;
    }
}

TEST(SlurmHostList, MalformedListsSayWhere) {
    const std::pair<std::string, std::string> cases[] = {
        {"", "host list is empty"},
        {"gpu[001-004", "a '[' without its ']' at character 4"},
        {"gpu001]", "a ']' without its '[' at character 7"},
        {"gpu[]", "empty brackets at character 4"},
        {"gpu[1-[2]]", "a '[' inside brackets at character 7"},
        {"gpu[a-b]", "'a-b' in brackets, which is neither a number"},
        {"gpu[1-]", "'1-' in brackets"},
        {"gpu[-3]", "'-3' in brackets"},
        {"gpu[1-2-3]", "'1-2-3' in brackets"},
        {"gpu[5-3]", "the range '5-3', whose low end is above its high end"},
        {"gpu[1,,2]", "an empty number in brackets at character 7"},
        {"gpu[1,]", "an empty number in brackets"},
        {"node1,,node2", "an empty host name at character 7"},
        {",node1", "an empty host name at character 1"},
        {"node1,", "an empty host name (a comma at the end)"},
        {"node1 node2", "a space or control character at character 6"},
        {"gpu[1-2],ok[9-1]", "the range '9-1'"},  // the whole list is checked
    };
    for (const auto& [list, needle] : cases) {
        auto got = slurm_first_host(list);
        ASSERT_FALSE(got.ok()) << list << " gave " << *got;
        EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument) << list;
        EXPECT_NE(got.status().message().find(needle), std::string::npos)
            << "want '" << needle << "' in: " << got.status().message();
    }
}

// Under srun MASTER_ADDR and MASTER_PORT default to the first host of the step and 29500 + job id
// mod 1000; values that are set win, and other launchers take no defaults from SLURM's variables.
TEST(ProcessGroup, SrunDefaults) {
    const EnvMap srun = {{"SLURM_PROCID", "5"},
                         {"SLURM_STEP_NUM_TASKS", "8"},
                         {"SLURM_LOCALID", "1"},
                         {"SLURM_JOB_NODELIST", "gpu[003-004]"},
                         {"SLURM_JOB_ID", "1234567"}};
    auto g = process_group_from_env(srun);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    EXPECT_EQ(g->launcher, Launcher::kSlurm);
    EXPECT_EQ(g->master_addr, "gpu003");  // no step list: the job's
    EXPECT_EQ(g->master_port, 29500 + 567);

    // A step that leaves out the job's first node (`srun -r 2`, or one of two steps on half the
    // nodes each): rank 0 is on the step's first node.
    EnvMap step = srun;
    step["SLURM_JOB_NODELIST"] = "gpu[001-004]";
    step["SLURM_STEP_NODELIST"] = "gpu[003-004]";
    auto st = process_group_from_env(step);
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    EXPECT_EQ(st->master_addr, "gpu003");
    step["SLURM_JOB_NODELIST"] = "gpu[";  // not read when the step's list is there
    st = process_group_from_env(step);
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    EXPECT_EQ(st->master_addr, "gpu003");
    step["SLURM_STEP_NODELIST"] = "gpu[003-004";
    st = process_group_from_env(step);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.status().message().find("environment variable SLURM_STEP_NODELIST: host list "
                                         "'gpu[003-004' has a '[' without its ']'"),
              std::string::npos)
        << st.status().message();

    EnvMap set = srun;
    set["MASTER_ADDR"] = "head";
    set["MASTER_PORT"] = "31000";
    auto s = process_group_from_env(set);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(s->master_addr, "head");
    EXPECT_EQ(s->master_port, 31000);

    EnvMap edge = srun;
    edge["SLURM_JOB_ID"] = "999";
    auto e = process_group_from_env(edge);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_EQ(e->master_port, 30499);
    edge["SLURM_JOB_ID"] = "4294967295";  // SLURM's ids are 32-bit unsigned
    e = process_group_from_env(edge);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_EQ(e->master_port, 29500 + 295);

    EnvMap none = srun;  // neither variable: the rendezvous has no address and says so later
    none.erase("SLURM_JOB_NODELIST");
    none.erase("SLURM_JOB_ID");
    auto n = process_group_from_env(none);
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    EXPECT_EQ(n->master_addr, "");
    EXPECT_EQ(n->master_port, 0);

    EnvMap torchrun = {{"RANK", "0"},
                       {"WORLD_SIZE", "2"},
                       {"LOCAL_RANK", "0"},
                       {"SLURM_JOB_NODELIST", "gpu[003-004]"},
                       {"SLURM_JOB_ID", "77"}};
    auto t = process_group_from_env(torchrun);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ(t->master_addr, "");
    EXPECT_EQ(t->master_port, 0);

    EnvMap bad_list = srun;
    bad_list["SLURM_JOB_NODELIST"] = "gpu[003-";
    auto bl = process_group_from_env(bad_list);
    ASSERT_FALSE(bl.ok());
    EXPECT_NE(bl.status().message().find("environment variable SLURM_JOB_NODELIST: host list "
                                         "'gpu[003-' has a '[' without its ']'"),
              std::string::npos)
        << bl.status().message();
    EnvMap bad_id = srun;
    bad_id["SLURM_JOB_ID"] = "12x";
    auto bi = process_group_from_env(bad_id);
    ASSERT_FALSE(bi.ok());
    EXPECT_NE(bi.status().message().find("SLURM_JOB_ID='12x' is not a whole number"),
              std::string::npos)
        << bi.status().message();
    bad_id["SLURM_JOB_ID"] = "-5";
    bi = process_group_from_env(bad_id);
    ASSERT_FALSE(bi.ok());
    EXPECT_NE(bi.status().message().find("SLURM_JOB_ID='-5'"), std::string::npos);
}

// A batch script's own process (sbatch sets SLURM_PROCID=0 and the allocation's SLURM_NTASKS, but
// no step variables) is one process, as without a launcher: `lathe prepare` before the srun line
// runs alone. The tasks srun starts from that script are the ranks.
TEST(ProcessGroup, BatchScriptWithoutSrunIsOneProcess) {
    const EnvMap batch = {{"SLURM_JOB_ID", "4242"}, {"SLURM_NTASKS", "8"},
                          {"SLURM_NPROCS", "8"},    {"SLURM_JOB_NODELIST", "gpu[001-002]"},
                          {"SLURM_PROCID", "0"},    {"SLURM_LOCALID", "0"},
                          {"SLURM_NODEID", "0"},    {"SLURM_TASKS_PER_NODE", "4(x2)"}};
    auto b = process_group_from_env(batch);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    expect_ranks(*b, Launcher::kNone, 0, 1, 0, 0);
    EXPECT_TRUE(b->single_process());
    EXPECT_EQ(b->master_addr, "");  // SLURM's defaults are srun's only
    EXPECT_EQ(b->master_port, 0);
    EXPECT_EQ(b->describe(), "a single process (no launcher)");

    // Without a launcher SLURM's variables are not read at all, malformed or not.
    EnvMap odd = batch;
    odd["SLURM_JOB_NODELIST"] = "gpu[";
    odd["SLURM_PROCID"] = "x";
    auto o = process_group_from_env(odd);
    ASSERT_TRUE(o.ok()) << o.status().to_string();
    EXPECT_EQ(o->launcher, Launcher::kNone);

    // The same environment as srun passes it to the tasks of a step: rank 6 of 8.
    EnvMap task = batch;
    task["SLURM_STEP_ID"] = "0";
    task["SLURM_STEP_NUM_TASKS"] = "8";
    task["SLURM_STEP_NODELIST"] = "gpu[001-002]";
    task["SLURM_STEP_TASKS_PER_NODE"] = "4(x2)";
    task["SLURM_PROCID"] = "6";
    task["SLURM_LOCALID"] = "2";
    auto t = process_group_from_env(task);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    expect_ranks(*t, Launcher::kSlurm, 6, 8, 2, 0);
    EXPECT_EQ(t->master_addr, "gpu001");
    EXPECT_EQ(t->master_port, 29500 + 242);
    EXPECT_EQ(t->describe(), "rank 6 of 8 (local rank 2, srun)");

    // `srun -n 1 lathe prepare` in that script: a step of one task, whatever SLURM_NTASKS says.
    EnvMap one = task;
    one["SLURM_STEP_NUM_TASKS"] = "1";
    one["SLURM_PROCID"] = "0";
    one["SLURM_LOCALID"] = "0";
    auto n = process_group_from_env(one);
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    expect_ranks(*n, Launcher::kSlurm, 0, 1, 0, 0);
    EXPECT_TRUE(n->single_process());
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
