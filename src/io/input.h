#pragma once
// Streaming input: files, gzip, zstd and stdin as one byte stream, and text records (lines, or
// blank-line-separated blocks) read from it with bounded memory whatever the input size.
//
// Compression is recognised by the first bytes of the data (magic numbers), never by the file
// name alone, so `corpus.txt` that is really gzip, dictd's `.dict.dz` (gzip with a dictzip
// header) and a zstd stream on stdin all read correctly:
//   gzip  1f 8b             (several concatenated members read as one stream, as gzip -d does)
//   zstd  28 b5 2f fd       (several frames, and skippable frames 5? 2a 4d 18, read in order)
// xz and bzip2 are recognised only to say clearly that they are not supported.
//
// Memory: an InputStream holds one raw buffer (256 KiB) and its decoder's window; a LineReader
// holds its longest line so far plus one read chunk; a line or block longer than
// `max_record_bytes` is an error rather than unbounded growth.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace lathe {

enum class InputCompression { kNone, kGzip, kZstd };

// "none", "gzip", "zstd".
const char* input_compression_name(InputCompression c);

// The name lathe uses for standard input in paths and messages.
inline constexpr std::string_view kStdinPath = "-";

struct InputOptions {
    // When set and it becomes true, a read waiting on a pipe or terminal returns a cancelled
    // error within about 0.2 s instead of blocking until data arrives.
    const std::atomic<bool>* cancel = nullptr;
};

// A readable byte stream: a regular file, a pipe, or stdin ("-"), transparently decompressed.
// Move-only; the descriptor is closed on destruction (stdin is left open).
class InputStream {
public:
    // Opens `path` ("-" = stdin) and identifies its compression from the first bytes. Errors: a
    // missing or unreadable file (message names the path and the OS reason), a directory, an
    // unsupported compression (xz, bzip2).
    static Result<InputStream> open(const std::string& path, const InputOptions& options = {});

    InputStream(InputStream&&) noexcept;
    InputStream& operator=(InputStream&&) noexcept;
    InputStream(const InputStream&) = delete;
    InputStream& operator=(const InputStream&) = delete;
    ~InputStream();

    // Reads up to `capacity` decompressed bytes into `dst`; returns how many, 0 only at the end
    // of the stream. Errors name the input: an OS read failure, corrupt compressed data, a
    // truncated gzip member or zstd frame, data after the last gzip member, cancellation.
    Result<size_t> read(char* dst, size_t capacity);

    // The path as given, or "<stdin>".
    const std::string& name() const;
    InputCompression compression() const;
    // Bytes taken from the underlying file so far (compressed bytes for gzip/zstd): what a
    // progress display compares with raw_size().
    uint64_t raw_bytes_read() const;
    // Size of the underlying file for regular files; 0 when unknown (pipes, stdin).
    uint64_t raw_size() const;
    // Decompressed bytes returned by read() so far.
    uint64_t bytes_read() const;

private:
    struct Impl;
    explicit InputStream(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// Upper bound on one line or block; a longer one is an error naming the file and line.
inline constexpr size_t kDefaultMaxRecordBytes = size_t{1} << 30;

// Splits a stream into lines at '\n'. A line is returned without its '\n' but with a '\r' that
// preceded it (callers that treat "\r\n" as the terminator strip it: see strip_cr()). The last
// line need not end in '\n'; a stream that ends with '\n' has no extra empty line after it.
class LineReader {
public:
    // Reads from `in`, which must outlive the reader.
    explicit LineReader(InputStream& in, size_t max_line_bytes = kDefaultMaxRecordBytes);

    // Sets `line` to the next line (valid until the next call) and returns true, or returns false
    // at the end. Errors: the stream's read errors, or a line longer than max_line_bytes (named by
    // file and line number).
    Result<bool> next(std::string_view& line);
    // 1-based number of the line last returned (0 before the first).
    uint64_t line_number() const { return line_number_; }
    InputStream& stream() { return in_; }
    const InputStream& stream() const { return in_; }

private:
    InputStream& in_;
    size_t max_line_bytes_;
    std::string buf_;  // [begin_, end_) holds bytes not yet returned
    size_t begin_ = 0;
    size_t end_ = 0;
    size_t scan_ = 0;  // bytes in [begin_, scan_) are known to hold no '\n'
    bool eof_ = false;
    uint64_t line_number_ = 0;
};

// `line` without one trailing '\r' (a "\r\n" line ending).
inline std::string_view strip_cr(std::string_view line) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    return line;
}

// True when `line` is empty or holds only ASCII whitespace (space, \t, \r, \v, \f).
bool is_blank_line(std::string_view line);

// How a text input is cut into documents.
enum class TextRecordFormat {
    kLines,   // one record per line ("\n" or "\r\n" terminated); empty lines are empty records
    kBlocks,  // one record per run of non-blank lines; blank lines only separate records
};

// One record: its bytes and the 1-based number of its first line.
struct TextRecord {
    std::string_view text;
    uint64_t line = 0;
};

// Reads records of a TextRecordFormat from a stream.
//  kLines:  each line without its terminator ("\n" or "\r\n").
//  kBlocks: the bytes of a block's lines with the line terminators between them kept exactly as
//           in the input and the last line's terminator removed.
class TextRecordReader {
public:
    TextRecordReader(InputStream& in, TextRecordFormat format,
                     size_t max_record_bytes = kDefaultMaxRecordBytes);

    // Sets `record` to the next record (its text valid until the next call) and returns true, or
    // returns false at the end. Errors: the stream's, or a record longer than max_record_bytes.
    Result<bool> next(TextRecord& record);
    const std::string& name() const { return lines_.stream().name(); }

private:
    LineReader lines_;
    TextRecordFormat format_;
    size_t max_record_bytes_;
    std::string block_;
};

}  // namespace lathe
