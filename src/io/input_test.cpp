#include "io/input.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "io/file.h"

namespace lathe {
namespace {

std::string temp_dir() {
    const auto dir =
        std::filesystem::temp_directory_path() / ("lathe_input_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    return dir.string();
}

std::string write_file(const std::string& name, std::string_view bytes) {
    const std::string path = temp_dir() + "/" + name;
    std::ofstream f(path, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
}

// One gzip member holding `data` (zlib's deflate with the gzip wrapper).
std::string gzip_member(std::string_view data) {
    z_stream zs{};
    EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
    std::string out(deflateBound(&zs, data.size()) + 64, '\0');
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    zs.avail_in = static_cast<uInt>(data.size());
    zs.next_out = reinterpret_cast<Bytef*>(out.data());
    zs.avail_out = static_cast<uInt>(out.size());
    EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
    out.resize(zs.total_out);
    deflateEnd(&zs);
    return out;
}

std::string zstd_frame(std::string_view data) {
    std::string out(ZSTD_compressBound(data.size()), '\0');
    const size_t n = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), 3);
    EXPECT_FALSE(ZSTD_isError(n));
    out.resize(n);
    return out;
}

Result<std::string> read_all(const std::string& path, size_t chunk = 4096) {
    LATHE_ASSIGN_OR_RETURN(InputStream in, InputStream::open(path));
    std::string out;
    std::vector<char> buf(chunk);
    for (;;) {
        LATHE_ASSIGN_OR_RETURN(size_t n, in.read(buf.data(), buf.size()));
        if (n == 0) break;
        out.append(buf.data(), n);
    }
    return out;
}

std::vector<std::pair<std::string, uint64_t>> records(const std::string& path,
                                                      TextRecordFormat format) {
    auto in = InputStream::open(path);
    EXPECT_TRUE(in.ok()) << in.status().to_string();
    TextRecordReader reader(*in, format);
    std::vector<std::pair<std::string, uint64_t>> out;
    TextRecord rec;
    for (;;) {
        auto more = reader.next(rec);
        EXPECT_TRUE(more.ok()) << more.status().to_string();
        if (!more.ok() || !*more) break;
        out.emplace_back(std::string(rec.text), rec.line);
    }
    return out;
}

// Several MB of varied lines, so that lines straddle every read and buffer boundary.
std::string big_text(std::vector<std::string>* lines_out) {
    std::mt19937 rng(7);
    std::string text;
    for (int i = 0; i < 12000; ++i) {
        const size_t len = (rng() % 7 == 0) ? rng() % 3000 : rng() % 90;
        std::string line;
        for (size_t j = 0; j < len; ++j) line.push_back(static_cast<char>('a' + rng() % 26));
        if (i % 1000 == 0) line += "\xc3\xa9\xe2\x82\xac";  // UTF-8 bytes pass through untouched
        text += line;
        text += '\n';
        if (lines_out != nullptr) lines_out->push_back(line);
    }
    return text;
}

TEST(InputStream, PlainFileReadsBackExactly) {
    const std::string text = big_text(nullptr);
    const std::string path = write_file("plain.txt", text);
    auto in = InputStream::open(path);
    ASSERT_TRUE(in.ok());
    EXPECT_EQ(in->compression(), InputCompression::kNone);
    EXPECT_EQ(in->raw_size(), text.size());
    auto back = read_all(path, 777);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(*back, text);
}

TEST(InputStream, GzipDetectedByMagicNotName) {
    const std::string text = big_text(nullptr);
    const std::string path = write_file("looks_plain.txt", gzip_member(text));
    auto in = InputStream::open(path);
    ASSERT_TRUE(in.ok());
    EXPECT_EQ(in->compression(), InputCompression::kGzip);
    auto back = read_all(path, 1000);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(*back, text);
}

TEST(InputStream, GzipConcatenatedMembersAndZeroPaddingReadAsOneStream) {
    const std::string path =
        write_file("multi.gz", gzip_member("first\n") + gzip_member("") + gzip_member("second\n") +
                                   std::string(16, '\0'));
    auto back = read_all(path, 3);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(*back, "first\nsecond\n");
}

TEST(InputStream, GzipTruncatedIsDataLoss) {
    const std::string gz = gzip_member(big_text(nullptr));
    const std::string path = write_file("cut.gz", gz.substr(0, gz.size() / 2));
    auto back = read_all(path);
    ASSERT_FALSE(back.ok());
    EXPECT_EQ(back.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(back.status().message().find("cut.gz: truncated gzip"), std::string::npos)
        << back.status().message();
    // Only the 8-byte trailer missing: still truncated, not silently accepted.
    const std::string path2 = write_file("cut2.gz", gz.substr(0, gz.size() - 4));
    EXPECT_EQ(read_all(path2).status().code(), StatusCode::kDataLoss);
}

TEST(InputStream, GzipCorruptAndTrailingGarbageAreErrors) {
    std::string gz = gzip_member(big_text(nullptr));
    std::string corrupt = gz;
    for (size_t i = 100; i < 200; ++i) corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5a);
    auto r = read_all(write_file("corrupt.gz", corrupt));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("corrupt gzip data"), std::string::npos)
        << r.status().message();

    auto t = read_all(write_file("trailing.gz", gzip_member("abc") + "hello"));
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("after the end of the gzip stream"), std::string::npos)
        << t.status().message();
}

TEST(InputStream, ZstdFramesDetectedAndRead) {
    const std::string text = big_text(nullptr);
    // Two frames and a skippable frame in between (magic 0x184D2A50, 4-byte size, payload).
    std::string skippable = std::string("\x50\x2a\x4d\x18\x03\x00\x00\x00xyz", 11);
    const std::string path = write_file(
        "data.bin", zstd_frame(text.substr(0, 1000)) + skippable + zstd_frame(text.substr(1000)));
    auto in = InputStream::open(path);
    ASSERT_TRUE(in.ok());
    EXPECT_EQ(in->compression(), InputCompression::kZstd);
    auto back = read_all(path, 4093);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(*back, text);
    // A stream that starts with a skippable frame is zstd too.
    auto s = read_all(write_file("skip_first.zst", skippable + zstd_frame("abc")));
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(*s, "abc");
}

TEST(InputStream, ZstdTruncatedAndCorruptAreErrors) {
    const std::string z = zstd_frame(big_text(nullptr));
    auto r = read_all(write_file("cut.zst", z.substr(0, z.size() - 3)));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find("cut.zst: truncated zstd"), std::string::npos)
        << r.status().message();
    std::string corrupt = z;
    for (size_t i = 20; i < 60; ++i) corrupt[i] = static_cast<char>(corrupt[i] ^ 0x33);
    auto c = read_all(write_file("corrupt.zst", corrupt));
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kDataLoss);
}

TEST(InputStream, UnsupportedCompressionAndBadPathsAreClearErrors) {
    auto xz = InputStream::open(write_file("a.xz", std::string("\xfd"
                                                               "7zXZ\x00\x00\x04",
                                                               8)));
    ASSERT_FALSE(xz.ok());
    EXPECT_NE(xz.status().message().find("xz"), std::string::npos);
    auto bz = InputStream::open(write_file("a.bz2", std::string("BZh91AY&SY\x00\x01", 12)));
    ASSERT_FALSE(bz.ok());
    EXPECT_NE(bz.status().message().find("bzip2"), std::string::npos);
    // "BZh" followed by ordinary text is text.
    EXPECT_TRUE(InputStream::open(write_file("bzh.txt", "BZh is a prefix of this text\n")).ok());

    auto missing = InputStream::open(temp_dir() + "/missing.jsonl");
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
    EXPECT_NE(missing.status().message().find("missing.jsonl"), std::string::npos);

    auto dir = InputStream::open(temp_dir());
    ASSERT_FALSE(dir.ok());
    EXPECT_NE(dir.status().message().find("directory"), std::string::npos);
}

TEST(InputStream, EmptyAndTinyFiles) {
    auto e = read_all(write_file("empty.txt", ""));
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(*e, "");
    auto one = read_all(write_file("one.txt", "\x1f"));  // a lone gzip magic byte is just a byte
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(*one, "\x1f");
}

TEST(InputStream, PipeIsReadAndCancelStopsAWaitingRead) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const std::string gz = gzip_member("piped line 1\npiped line 2\n");
    std::thread writer([&] {
        for (char c : gz) {  // one byte at a time: detection must wait for enough bytes
            ASSERT_EQ(::write(fds[1], &c, 1), 1);
        }
        ::close(fds[1]);
    });
    auto back = read_all("/dev/fd/" + std::to_string(fds[0]));
    writer.join();
    ::close(fds[0]);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(*back, "piped line 1\npiped line 2\n");

    ASSERT_EQ(::pipe(fds), 0);
    ASSERT_EQ(::write(fds[1], "0123456789abc", 13), 13);  // enough to open; then nothing more
    std::atomic<bool> cancel{false};
    auto in = InputStream::open("/dev/fd/" + std::to_string(fds[0]), InputOptions{&cancel});
    ASSERT_TRUE(in.ok()) << in.status().to_string();
    char buf[64];
    auto first = in->read(buf, sizeof(buf));
    ASSERT_TRUE(first.ok());
    EXPECT_EQ(*first, 13u);
    std::thread canceller([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        cancel = true;
    });
    const auto t0 = std::chrono::steady_clock::now();
    auto blocked = in->read(buf, sizeof(buf));
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    canceller.join();
    ASSERT_FALSE(blocked.ok());
    EXPECT_EQ(blocked.status().code(), StatusCode::kCancelled);
    EXPECT_LT(waited, 2.0);
    ::close(fds[0]);
    ::close(fds[1]);
}

TEST(LineReader, SplitsLinesAcrossBufferBoundariesGzipAndZstd) {
    std::vector<std::string> expected;
    const std::string text = big_text(&expected);
    for (const std::string& path :
         {write_file("lines.txt", text), write_file("lines.gz", gzip_member(text)),
          write_file("lines.zst", zstd_frame(text))}) {
        const auto got = records(path, TextRecordFormat::kLines);
        ASSERT_EQ(got.size(), expected.size()) << path;
        for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_EQ(got[i].first, expected[i]) << path << " line " << i + 1;
            ASSERT_EQ(got[i].second, i + 1);
        }
    }
}

TEST(LineReader, LastLineWithoutNewlineCrlfAndEmptyLines) {
    const auto got =
        records(write_file("crlf.txt", "a\r\n\nb\r\r\nlast"), TextRecordFormat::kLines);
    ASSERT_EQ(got.size(), 4u);
    EXPECT_EQ(got[0].first, "a");
    EXPECT_EQ(got[1].first, "");
    EXPECT_EQ(got[2].first, "b\r");  // only one "\r" belongs to the line ending
    EXPECT_EQ(got[3].first, "last");
    EXPECT_EQ(got[3].second, 4u);
    EXPECT_TRUE(records(write_file("nl.txt", "\n"), TextRecordFormat::kLines).size() == 1);
    EXPECT_TRUE(records(write_file("none.txt", ""), TextRecordFormat::kLines).empty());
}

TEST(LineReader, LinesLongerThanOneReadChunkGrowTheBuffer) {
    const std::string huge(3u << 20, 'h');
    const auto got =
        records(write_file("huge.gz", gzip_member("a\n" + huge + "\nb")), TextRecordFormat::kLines);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[1].first, huge);
    EXPECT_EQ(got[2].first, "b");
}

TEST(LineReader, OverlongLineIsAnErrorWithItsLineNumber) {
    const std::string path = write_file("long.txt", "short\nok\n" + std::string(5000, 'x') + "\n");
    auto in = InputStream::open(path);
    ASSERT_TRUE(in.ok());
    LineReader reader(*in, 4096);
    std::string_view line;
    ASSERT_TRUE(*reader.next(line));
    ASSERT_TRUE(*reader.next(line));
    auto r = reader.next(line);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("long.txt:3: line is longer than 4096 bytes"),
              std::string::npos)
        << r.status().message();
}

TEST(TextRecordReader, BlocksSeparatedByBlankAndWhitespaceLines) {
    const std::string text =
        "\n\n  \nfirst block\nsecond line\n\n\n\t \r\nnext\r\nwith crlf\r\n\nlast\nno newline";
    const auto got = records(write_file("blocks.txt", text), TextRecordFormat::kBlocks);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[0].first, "first block\nsecond line");
    EXPECT_EQ(got[0].second, 4u);
    EXPECT_EQ(got[1].first, "next\r\nwith crlf");  // terminators inside a block kept as they are
    EXPECT_EQ(got[1].second, 9u);
    EXPECT_EQ(got[2].first, "last\nno newline");
    EXPECT_EQ(got[2].second, 12u);
    EXPECT_TRUE(records(write_file("blank.txt", "\n \n\t\n"), TextRecordFormat::kBlocks).empty());
}

TEST(TextRecordReader, BlocksFromGzipMatchPlain) {
    std::string text;
    std::vector<std::string> expected;
    std::mt19937 rng(3);
    for (int b = 0; b < 5000; ++b) {
        std::string block;
        const int nlines = 1 + static_cast<int>(rng() % 6);
        for (int l = 0; l < nlines; ++l) {
            if (l > 0) block += '\n';
            block += "entry " + std::to_string(b) + " line " + std::to_string(l);
        }
        expected.push_back(block);
        text += block + "\n" + std::string(1 + rng() % 3, '\n');
    }
    const auto plain = records(write_file("b.txt", text), TextRecordFormat::kBlocks);
    const auto gz = records(write_file("b.gz", gzip_member(text)), TextRecordFormat::kBlocks);
    ASSERT_EQ(plain.size(), expected.size());
    ASSERT_EQ(plain, gz);
    for (size_t i = 0; i < expected.size(); ++i) ASSERT_EQ(plain[i].first, expected[i]);
}

TEST(TextRecordReader, OverlongBlockIsAnError) {
    std::string text = "a\n\n";
    for (int i = 0; i < 100; ++i) text += std::string(50, 'y') + "\n";
    auto in = InputStream::open(write_file("bigblock.txt", text));
    ASSERT_TRUE(in.ok());
    TextRecordReader reader(*in, TextRecordFormat::kBlocks, 1000);
    TextRecord rec;
    ASSERT_TRUE(*reader.next(rec));
    auto r = reader.next(rec);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("bigblock.txt:3: the block starting here is longer"),
              std::string::npos)
        << r.status().message();
}

}  // namespace
}  // namespace lathe
