#include "run/report.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>

#include <filesystem>
#include <fstream>
#include <string>

namespace lathe {
namespace {

namespace fs = std::filesystem;

size_t count(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
}

TEST(ReportTest, HtmlEscapeReplacesMarkup) {
    EXPECT_EQ(html_escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
    EXPECT_EQ(html_escape("plain"), "plain");
}

TEST(ReportTest, OnePathPerSeriesWithPoints) {
    const std::vector<PlotSeries> series = {
        {"bf16", {{1, 5.0}, {2, 4.0}, {3, 3.5}}},
        {"fp8", {{1, 5.1}, {2, 4.2}}},
        {"empty", {}},
    };
    const std::string svg = svg_plot("loss against step", "step", "loss", series);
    EXPECT_EQ(count(svg, "<path "), 2u);
    EXPECT_EQ(count(svg, "data-series=\"bf16\""), 1u);
    EXPECT_EQ(count(svg, "data-series=\"fp8\""), 1u);
    EXPECT_EQ(count(svg, "class=\"legend\""), 2u);
    EXPECT_EQ(count(svg, ">empty<"), 0u);
    // Three points of the first series: one move and two line commands.
    const size_t at = svg.find("data-series=\"bf16\" d=\"");
    ASSERT_NE(at, std::string::npos);
    const std::string d = svg.substr(at, svg.find("\" fill", at) - at);
    EXPECT_EQ(count(d, "M"), 1u);
    EXPECT_EQ(count(d, " L"), 2u);
}

TEST(ReportTest, AxesAreLabelled) {
    const std::string svg = svg_plot("T", "tokens", "learning rate", {{"a", {{0, 1}, {10, 2}}}});
    EXPECT_NE(svg.find("class=\"x-label\""), std::string::npos);
    EXPECT_NE(svg.find(">tokens</text>"), std::string::npos);
    EXPECT_NE(svg.find("class=\"y-label\""), std::string::npos);
    EXPECT_NE(svg.find(">learning rate</text>"), std::string::npos);
    // Ticks from 0 to 10 in steps of 2 along x.
    EXPECT_NE(svg.find(">0</text>"), std::string::npos);
    EXPECT_NE(svg.find(">10</text>"), std::string::npos);
}

TEST(ReportTest, NamesAndLabelsAreEscaped) {
    const std::string svg =
        svg_plot("<t>", "x&y", "\"y\"", {{"<script>alert(1)</script>", {{0, 1}, {1, 2}}}});
    EXPECT_EQ(svg.find("<script"), std::string::npos);
    EXPECT_EQ(svg.find("<t>"), std::string::npos);
    EXPECT_NE(svg.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
    EXPECT_NE(svg.find("x&amp;y"), std::string::npos);
    EXPECT_NE(svg.find("&quot;y&quot;"), std::string::npos);
}

TEST(ReportTest, NonFinitePointsAreLeftOut) {
    const std::string svg = svg_plot("T", "x", "y", {{"a", {{0, 1}, {1, std::nan("")}, {2, 3}}}});
    EXPECT_EQ(count(svg, " L"), 1u);
    EXPECT_EQ(svg.find("nan"), std::string::npos);
}

// Values a few ulps apart (a constant learning rate read back from text) get a widened range and a
// handful of ticks, not a tick step too small to advance (which never ended).
TEST(ReportTest, ValuesUlpsApartGetAWidenedRange) {
    const double a = 0.001, b = std::nextafter(0.001, 1.0);
    const std::string svg = svg_plot("T", "x", "y", {{"a", {{0, a}, {1, b}, {2, a}}}});
    EXPECT_EQ(count(svg, "<path class=\"series\""), 1u);
    EXPECT_LT(count(svg, "<line "), 40u);
}

// A series of one point is drawn as a dot (a zero-length segment with a round cap), not as a
// lone move-to, which SVG draws as nothing.
TEST(ReportTest, AOnePointSeriesIsADot) {
    const std::string svg = svg_plot("T", "x", "y", {{"a", {{5, 1.5}}}, {"b", {{1, 1}, {2, 2}}}});
    EXPECT_EQ(count(svg, " h0.01\""), 1u);
    EXPECT_EQ(count(svg, "stroke-linecap=\"round\""), 2u);
}

class ReportFileTest : public ::testing::Test {
protected:
    void SetUp() override {
        root_ = fs::temp_directory_path() /
                ("lathe_report_" + std::to_string(getpid()) + "_" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(root_);
        fs::create_directories(root_);
    }
    void TearDown() override { fs::remove_all(root_); }
    fs::path root_;
};

TEST_F(ReportFileTest, JsonlFileOverlaysAndEscapesConfig) {
    const fs::path run = root_ / "run<1>";
    fs::create_directories(run);
    std::ofstream(run / "config.yaml")
        << "model:\n  family: llama\n  hidden_size: 48\n  num_hidden_layers: 2\n"
           "data:\n  path: d\n  tokenizer: t.json\ntrain:\n  steps: 4\n# <b>&\n";
    std::ofstream(run / "metrics.jsonl")
        << "{\"step\": 1, \"split\": \"train\", \"loss\": 5.0, \"lr\": 0.001, \"tokens\": 32}\n"
           "{\"step\": 2, \"split\": \"train\", \"loss\": 4.0, \"lr\": 0.001, \"tokens\": 64}\n"
           "{\"step\": 2, \"split\": \"valid\", \"loss\": 4.5, \"tokens\": 64}\n";
    std::ofstream(root_ / "base.jsonl")
        << "{\"step\": 1, \"loss\": 5.5}\n{\"step\": 2, \"loss\": 4.8}\n";
    const fs::path out = root_ / "r.html";
    ASSERT_TRUE(write_report({run.string(), (root_ / "base.jsonl").string()}, out.string()).ok());
    std::ifstream in(out);
    const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Training loss against step: both runs; against tokens: only the run with "tokens".
    EXPECT_EQ(count(html, "data-series=\"base.jsonl\""), 1u);
    EXPECT_EQ(count(html, "data-series=\"run&lt;1&gt;\""), 6u);  // loss, valid loss, lr x 2 axes
    EXPECT_NE(html.find("# &lt;b&gt;&amp;"), std::string::npos);
    EXPECT_EQ(html.find("<b>&"), std::string::npos);
    EXPECT_NE(html.find("<td>2/4</td>"), std::string::npos);
    EXPECT_NE(html.find("<td>JSONL file</td>"), std::string::npos);
    EXPECT_EQ(html.find("<script"), std::string::npos);
    EXPECT_EQ(html.find("http"), std::string::npos);
}

TEST_F(ReportFileTest, MfuIsPlottedOnlyWhenLogged) {
    std::ofstream(root_ / "cpu.jsonl")
        << "{\"step\": 1, \"loss\": 5}\n{\"step\": 2, \"loss\": 4}\n";
    std::ofstream(root_ / "gpu.jsonl")
        << "{\"step\": 1, \"loss\": 5, \"mfu\": 0.41}\n{\"step\": 2, \"loss\": 4, \"mfu\": 0.43}\n";
    auto cpu = report_read_run((root_ / "cpu.jsonl").string());
    auto gpu = report_read_run((root_ / "gpu.jsonl").string());
    ASSERT_TRUE(cpu.ok() && gpu.ok());
    EXPECT_EQ(report_html({*cpu}).find("MFU against"), std::string::npos);
    const std::string both = report_html({*cpu, *gpu});
    const size_t at = both.find(">MFU against step</text>");
    ASSERT_NE(at, std::string::npos);
    const std::string svg = both.substr(at, both.find("</svg>", at) - at);
    EXPECT_EQ(count(svg, "<path "), 1u);
    EXPECT_EQ(count(svg, "data-series=\"gpu.jsonl\""), 1u);
}

TEST_F(ReportFileTest, ErrorsNameTheFileAndLine) {
    std::ofstream(root_ / "bad.jsonl") << "{\"step\": 1, \"loss\": 5}\nnot json\n";
    auto bad = report_read_run((root_ / "bad.jsonl").string());
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("bad.jsonl:2"), std::string::npos);
    std::ofstream(root_ / "nostep.jsonl") << "{\"loss\": 5}\n";
    auto nostep = report_read_run((root_ / "nostep.jsonl").string());
    ASSERT_FALSE(nostep.ok());
    EXPECT_NE(nostep.status().message().find("nostep.jsonl:1"), std::string::npos);
    auto missing = report_read_run((root_ / "nope").string());
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
    fs::create_directories(root_ / "empty");
    auto empty = report_read_run((root_ / "empty").string());
    ASSERT_FALSE(empty.ok());
    EXPECT_NE(empty.status().message().find("no metrics.jsonl"), std::string::npos);
    EXPECT_FALSE(fs::exists(root_ / "r.html"));
    EXPECT_FALSE(write_report({(root_ / "bad.jsonl").string()}, (root_ / "r.html").string()).ok());
    EXPECT_FALSE(fs::exists(root_ / "r.html"));
}

}  // namespace
}  // namespace lathe
