// A driver, not a test of its own: tests/test_gpt2_dataset.py runs (one command)
//   LATHE_GPT2_DATASET_SPEC=spec.json data_tests --gtest_also_run_disabled_tests
//       --gtest_filter=Gpt2DatasetDriver.*
// to make lathe build GPT-NeoX datasets (index caches included) and numpy-compatible random
// streams from a JSON spec, and compares what it writes with what GPT-NeoX's own code wrote
// (tests/fixtures/gpt2_dataset) and with numpy. Without the variable the driver is skipped.
//
// Spec: {
//   "out": "result.json",
//   "corpora": [{"prefix": "/tmp/x/a", "documents": [[1, 2], [3]]}   (in memory)
//               | {"prefix": "/tmp/x/b", "indexed": true}],          (<prefix>.bin/.idx)
//   "args": {GptNeoxDataArgs fields by their GPT-NeoX names},           (optional)
//   "dump": {"count": 50, "end": true, "extra": [1000]},  per split: sample indices
//           [0, min(count, size)), then size itself when "end", then the extra ones
//   "rng": [{"op": "shuffle", "seed": 1, "n": 100},
//           {"op": "randint", "seed": 1, "low": 0, "high": 10, "size": 5, "dtype": "int64"},
//           {"op": "random_sample", "seed": 1, "size": 5}],
//   "loader": {"micro_batch": 4, "dp_world": 2, "dataset_size": 100, "steps": 30}
// }
// Result: {"splits": {"train": {"size": n, "samples": [{"index", "tokens", "labels", "documents"}],
//          "datasets": [{"name", "prefix", "num_epochs", "doc_idx", "sample_idx", "shuffle_idx",
//          "loaded_from_cache"}]}, ...}, "rng": [[...], ...],
//          "loader": [[first index of rank 0, rank 1, ...] per micro-step]}

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>

#include "core/numpy_random.h"
#include "data/blend.h"
#include "data/gpt2_dataset.h"
#include "io/file.h"

namespace lathe {
namespace {

using nlohmann::json;

Result<NumpyIntDtype> dtype_named(const std::string& name) {
    static const std::map<std::string, NumpyIntDtype> kNames = {
        {"int64", NumpyIntDtype::kInt64},   {"int32", NumpyIntDtype::kInt32},
        {"int16", NumpyIntDtype::kInt16},   {"int8", NumpyIntDtype::kInt8},
        {"uint64", NumpyIntDtype::kUint64}, {"uint32", NumpyIntDtype::kUint32},
        {"uint16", NumpyIntDtype::kUint16}, {"uint8", NumpyIntDtype::kUint8},
        {"bool", NumpyIntDtype::kBool}};
    auto it = kNames.find(name);
    if (it == kNames.end()) return invalid_argument_error("unknown dtype {}", name);
    return it->second;
}

Result<json> run_rng(const json& ops) {
    json out = json::array();
    for (const json& op : ops) {
        const std::string kind = op.at("op");
        NumpyRandomState rs(op.at("seed").get<uint32_t>());
        if (kind == "shuffle") {
            std::vector<int64_t> a(op.at("n").get<size_t>());
            for (size_t i = 0; i < a.size(); ++i) a[i] = int64_t(i);
            rs.shuffle(std::span<int64_t>(a));
            out.push_back(a);
        } else if (kind == "randint") {
            LATHE_ASSIGN_OR_RETURN(NumpyIntDtype dtype, dtype_named(op.at("dtype")));
            LATHE_ASSIGN_OR_RETURN(auto values,
                                   rs.randint(op.at("low"), op.at("high"), op.at("size"), dtype));
            out.push_back(values);
        } else if (kind == "random_sample") {
            std::vector<double> v;
            for (int64_t i = 0; i < op.at("size").get<int64_t>(); ++i)
                v.push_back(rs.random_sample());
            out.push_back(v);
        } else {
            return invalid_argument_error("unknown rng op {}", kind);
        }
    }
    return out;
}

template <typename T>
void read_list(const json& args, const char* key, std::vector<T>& dst) {
    if (args.contains(key) && !args.at(key).is_null()) dst = args.at(key).get<std::vector<T>>();
}

GptNeoxDataArgs parse_args(const json& j) {
    GptNeoxDataArgs a;
    if (j.contains("data_path") && !j.at("data_path").is_null()) a.data_path = j.at("data_path");
    if (j.contains("split")) a.split = j.at("split");
    read_list(j, "train_data_paths", a.train_data_paths);
    read_list(j, "valid_data_paths", a.valid_data_paths);
    read_list(j, "test_data_paths", a.test_data_paths);
    read_list(j, "train_label_data_paths", a.train_label_data_paths);
    read_list(j, "valid_label_data_paths", a.valid_label_data_paths);
    read_list(j, "test_label_data_paths", a.test_label_data_paths);
    read_list(j, "train_data_weights", a.train_data_weights);
    read_list(j, "valid_data_weights", a.valid_data_weights);
    read_list(j, "test_data_weights", a.test_data_weights);
    a.weight_by_num_documents = j.value("weight_by_num_documents", false);
    a.weighted_sampler_alpha = j.value("weighted_sampler_alpha", 1.0);
    a.seq_length = j.at("seq_length");
    a.seed = j.at("seed");
    if (j.contains("train_iters") && !j.at("train_iters").is_null())
        a.train_iters = j.at("train_iters");
    if (j.contains("train_epochs") && !j.at("train_epochs").is_null())
        a.train_epochs = j.at("train_epochs");
    a.train_batch_size = j.value("train_batch_size", int64_t{1});
    a.eval_interval = j.value("eval_interval", int64_t{1000});
    a.eval_iters = j.value("eval_iters", int64_t{10});
    if (j.value("flavor", std::string("gpt-neox")) == "megatron") {
        a.flavor = IndexFlavor::kMegatronSeparateLastEpoch;
    }
    if (j.value("naming", std::string("gpt-neox")) == "legacy") a.naming = CacheNaming::kLegacy;
    a.allow_chopped = j.value("allow_chopped", true);
    a.use_cache = j.value("use_cache", true);
    return a;
}

Result<json> dump_samples(const SampleSource& source, const json& dump) {
    json out;
    out["size"] = source.size();
    std::vector<int64_t> indices;
    const int64_t count = std::min<int64_t>(dump.value("count", int64_t{0}), source.size());
    for (int64_t i = 0; i < count; ++i) indices.push_back(i);
    if (dump.value("end", false)) indices.push_back(source.size());
    if (dump.contains("extra")) {
        for (int64_t i : dump.at("extra").get<std::vector<int64_t>>()) indices.push_back(i);
    }
    json samples = json::array();
    Sample s;
    for (int64_t i : indices) {
        LATHE_RETURN_IF_ERROR(source.get(s, i));
        json docs = json::array();
        for (const DocumentSegment& d : s.documents)
            docs.push_back({d.start, d.length, d.document});
        samples.push_back(
            {{"index", i}, {"tokens", s.tokens}, {"labels", s.labels}, {"documents", docs}});
    }
    out["samples"] = samples;
    return out;
}

Status run_spec(const std::string& spec_path) {
    LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(spec_path));
    const json spec = json::parse(text);
    json result;
    if (spec.contains("rng")) {
        LATHE_ASSIGN_OR_RETURN(result["rng"], run_rng(spec.at("rng")));
    }
    if (spec.contains("loader")) {
        // {"micro_batch", "dp_world", "dataset_size", "steps"}: first index per (step, rank).
        const json& l = spec.at("loader");
        json starts = json::array();
        for (int64_t step = 0; step < l.at("steps").get<int64_t>(); ++step) {
            std::vector<int64_t> row;
            for (int64_t rank = 0; rank < l.at("dp_world").get<int64_t>(); ++rank) {
                LATHE_ASSIGN_OR_RETURN(
                    int64_t first,
                    gpt_neox_micro_batch_start(step, l.at("micro_batch"), l.at("dp_world"), rank,
                                               l.at("dataset_size")));
                row.push_back(first);
            }
            starts.push_back(row);
        }
        result["loader"] = starts;
    }
    if (spec.contains("args")) {
        std::map<std::string, std::vector<std::vector<int32_t>>> memory;
        for (const json& c : spec.value("corpora", json::array())) {
            if (c.contains("documents")) memory[c.at("prefix")] = c.at("documents");
        }
        const TokenDocumentsOpener open =
            [&](const std::string& prefix) -> Result<std::unique_ptr<TokenDocuments>> {
            auto it = memory.find(prefix);
            if (it != memory.end()) {
                return std::unique_ptr<TokenDocuments>(
                    std::make_unique<InMemoryDocuments>(prefix, it->second));
            }
            return open_indexed_token_documents(prefix);
        };
        LATHE_ASSIGN_OR_RETURN(GptNeoxDatasets built,
                               gpt_neox_build_datasets(parse_args(spec.at("args")), open));
        const char* names[3] = {"train", "valid", "test"};
        for (int s = 0; s < 3; ++s) {
            if (built.splits[s] == nullptr) continue;
            LATHE_ASSIGN_OR_RETURN(
                json split, dump_samples(*built.splits[s], spec.value("dump", json::object())));
            json datasets = json::array();
            for (const auto& ds : built.datasets) {
                const IndexMappingRequest& r = ds->request();
                if (r.name != names[s] && r.name.rfind(std::string(names[s]) + "_", 0) != 0)
                    continue;
                const IndexCachePaths p = index_cache_paths(r);
                datasets.push_back({{"name", r.name},
                                    {"prefix", r.data_prefix},
                                    {"num_epochs", ds->mappings().num_epochs},
                                    {"separate_last_epoch", ds->mappings().separate_last_epoch},
                                    {"loaded_from_cache", ds->mappings().loaded_from_cache},
                                    {"size", ds->size()},
                                    {"doc_idx", p.doc_idx},
                                    {"sample_idx", p.sample_idx},
                                    {"shuffle_idx", p.shuffle_idx}});
            }
            split["datasets"] = datasets;
            result["splits"][names[s]] = split;
        }
    }
    return file_write_atomic(spec.at("out").get<std::string>(), result.dump());
}

// DISABLED_: a driver, not a test of its own; CTest does not run it, tests/test_gpt2_dataset.py
// does (with --gtest_also_run_disabled_tests and a spec).
TEST(Gpt2DatasetDriver, DISABLED_RunSpecFromEnvironment) {
    const char* spec = std::getenv("LATHE_GPT2_DATASET_SPEC");
    ASSERT_NE(spec, nullptr) << "set LATHE_GPT2_DATASET_SPEC (tests/test_gpt2_dataset.py does)";
    const Status st = run_spec(spec);
    ASSERT_TRUE(st.ok()) << st.to_string();
}

}  // namespace
}  // namespace lathe
