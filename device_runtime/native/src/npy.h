// NumPy .npy and .npz files, read a few rows at a time.
//
// The board has 512 MB and a dataset may not fit, so nothing here maps or reads a whole array: npy_open
// and npz_open only parse headers and record where each array's data starts, and RowReader pread()s the
// rows a batch needs.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "errors.h"

// The data is used in place as little-endian; both targets (x86_64, arm64) are.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "npy.h assumes a little-endian host");

namespace edgefl {

struct NpyArray {
    std::string path;            // the .npy file, or the .npz archive holding it
    std::string descr;           // normalized: '<' for multi-byte types, '|' for single bytes ("<f4", "|u1")
    std::vector<int64_t> shape;  // empty for a 0-d array
    bool fortran = false;        // always false: Fortran-order arrays are rejected
    uint64_t data_offset = 0;    // absolute byte offset of the first element in `path`
    size_t itemsize = 0;
};

namespace detail {

// Bytes the parsers read: a file, or a buffer already in memory. read_at gives exactly n bytes at `offset`
// or throws a UserError; nothing past size() is ever read.
class Source {
public:
    virtual ~Source() = default;
    virtual uint64_t size() const = 0;
    virtual void read_at(void* buf, size_t n, uint64_t offset) const = 0;
};

// A buffer someone else owns (a fuzz input, a file read whole); `name` is what messages call it.
class Bytes final : public Source {
public:
    Bytes(const uint8_t* data, size_t size, std::string name) : data_(data), size_(size), name_(std::move(name)) {}
    uint64_t size() const override { return size_; }
    void read_at(void* buf, size_t n, uint64_t offset) const override {
        if (offset > size_ || n > size_ - offset)
            throw UserError(name_ + ": ends early, at byte " + std::to_string(std::min<uint64_t>(offset, size_)) +
                            "; it is truncated: copy it again");
        if (n) std::memcpy(buf, data_ + offset, n);
    }

private:
    const uint8_t* data_;
    size_t size_;
    std::string name_;
};

// An open file descriptor, closed when it goes out of scope.
class Fd final : public Source {
public:
    Fd() = default;
    Fd(const std::string& path) : path_(path) {
        fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd_ < 0) throw UserError(path + ": cannot open (" + std::strerror(errno) + ")");
    }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}
    Fd& operator=(Fd&& o) noexcept {
        if (this != &o) {
            close();
            fd_ = std::exchange(o.fd_, -1);
            path_ = std::move(o.path_);
        }
        return *this;
    }
    ~Fd() { close(); }

    uint64_t size() const override {
        struct stat st;
        if (::fstat(fd_, &st) != 0) throw UserError(path_ + ": cannot stat (" + std::strerror(errno) + ")");
        return static_cast<uint64_t>(st.st_size);
    }

    // Exactly n bytes at `offset`: pread may return less than asked (signals, network filesystems).
    void read_at(void* buf, size_t n, uint64_t offset) const override {
        auto* p = static_cast<char*>(buf);
        while (n > 0) {
            ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
            if (got < 0) {
                if (errno == EINTR) continue;
                throw UserError(path_ + ": read failed at byte " + std::to_string(offset) + " (" +
                                std::strerror(errno) + ")");
            }
            if (got == 0)
                throw UserError(path_ + ": file ends early, at byte " + std::to_string(offset) +
                                "; it is truncated: copy it again");
            p += got;
            n -= static_cast<size_t>(got);
            offset += static_cast<uint64_t>(got);
        }
    }

private:
    int fd_ = -1;
    std::string path_;

    void close() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }
};

inline uint16_t le16(const uint8_t* p) { return uint16_t(p[0] | p[1] << 8); }
inline uint32_t le32(const uint8_t* p) { return uint32_t(le16(p)) | uint32_t(le16(p + 2)) << 16; }
inline uint64_t le64(const uint8_t* p) { return uint64_t(le32(p)) | uint64_t(le32(p + 4)) << 32; }

// The dtypes convert_rows understands; anything else is refused when the file is opened rather than
// halfway through training.
inline bool known_descr(const std::string& d) {
    static const char* const known[] = {"<f4", "<f8", "|u1", "|i1", "|b1", "<i2", "<u2",
                                        "<i4", "<u4", "<i8", "<u8"};
    for (const char* k : known)
        if (d == k) return true;
    return false;
}

// The header is a Python dict literal written by numpy, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (60000, 1, 28, 28), }
// Parsed by hand, accepting exactly what numpy's own reader (ast.literal_eval) accepts for these keys.
class NpyHeaderParser {
public:
    NpyHeaderParser(const std::string& text, const std::string& who) : s_(text), who_(who) {}

    void parse(NpyArray& a) {
        bool have_descr = false, have_fortran = false, have_shape = false;
        skip_ws();
        expect('{');
        for (;;) {
            skip_ws();
            if (peek() == '}') break;
            std::string key = parse_str();
            skip_ws();
            expect(':');
            skip_ws();
            if (key == "descr") {
                if (peek() == '[')
                    throw UserError(who_ + ": structured (record) dtypes are not supported; save one plain "
                                           "numeric array per field");
                a.descr = parse_str();
                have_descr = true;
            } else if (key == "fortran_order") {
                a.fortran = parse_bool();
                have_fortran = true;
            } else if (key == "shape") {
                a.shape = parse_shape();
                have_shape = true;
            } else {
                bad("unexpected key '" + key + "'");
            }
            skip_ws();
            if (peek() == ',') {
                ++pos_;
                continue;
            }
            if (peek() != '}') bad("expected ',' or '}'");
        }
        if (!have_descr || !have_fortran || !have_shape) bad("a key is missing");
    }

private:
    const std::string& s_;
    const std::string& who_;
    size_t pos_ = 0;

    [[noreturn]] void bad(const std::string& what) const {
        throw UserError(who_ + ": not a valid .npy header (" + what + " at byte " + std::to_string(pos_) +
                        "); save the array with numpy.save");
    }
    char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
    void skip_ws() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
            ++pos_;
    }
    void expect(char c) {
        if (peek() != c) bad(std::string("expected '") + c + "'");
        ++pos_;
    }
    std::string parse_str() {
        char q = peek();
        if (q != '\'' && q != '"') bad("expected a string");
        size_t end = s_.find(q, pos_ + 1);  // numpy's keys and dtype strings contain no quotes or escapes
        if (end == std::string::npos) bad("unterminated string");
        std::string out = s_.substr(pos_ + 1, end - pos_ - 1);
        pos_ = end + 1;
        return out;
    }
    bool parse_bool() {
        if (s_.compare(pos_, 4, "True") == 0) return pos_ += 4, true;
        if (s_.compare(pos_, 5, "False") == 0) return pos_ += 5, false;
        bad("expected True or False");
    }
    std::vector<int64_t> parse_shape() {
        std::vector<int64_t> shape;
        expect('(');
        for (;;) {
            skip_ws();
            if (peek() == ')') break;
            if (peek() < '0' || peek() > '9') bad("expected a dimension");
            int64_t v = 0;
            while (peek() >= '0' && peek() <= '9') {
                if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) bad("dimension too large");
                v = v * 10 + (s_[pos_++] - '0');
            }
            if (peek() == 'L') ++pos_;  // numpy under Python 2 wrote longs as 10L
            shape.push_back(v);
            skip_ws();
            if (peek() == ',') {
                ++pos_;
                continue;
            }
            if (peek() != ')') bad("expected ',' or ')'");
        }
        ++pos_;
        return shape;
    }
};

// Parses the .npy header found at `base` in `fd` (a file, or a STORED member of a zip) and checks that
// the data fits in the `avail` bytes there. `who` names the array in messages.
inline NpyArray read_npy_header(const Source& fd, const std::string& path, const std::string& who, uint64_t base,
                                uint64_t avail) {
    uint8_t pre[12];
    if (avail < 10) throw UserError(who + ": not a .npy file (too short); save the array with numpy.save");
    fd.read_at(pre, avail < 12 ? 10 : 12, base);
    if (std::memcmp(pre, "\x93NUMPY", 6) != 0)
        throw UserError(who + ": not a .npy file (bad magic); save the array with numpy.save");
    unsigned major = pre[6], minor = pre[7];
    uint64_t prefix, header_len;
    if (major == 1 && minor == 0) {
        prefix = 10;
        header_len = le16(pre + 8);
    } else if ((major == 2 || major == 3) && minor == 0 && avail >= 12) {
        prefix = 12;  // 2.0 widened the length to 4 bytes; 3.0 only made the header UTF-8
        header_len = le32(pre + 8);
    } else {
        throw UserError(who + ": .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                        " is not supported; save the array with numpy.save");
    }
    // numpy itself refuses headers over 10000 bytes by default; 1 MiB bounds what a corrupt length allocates.
    if (header_len > (1u << 20) || prefix + header_len > avail)
        throw UserError(who + ": the .npy header is truncated or corrupt; save the array with numpy.save");
    std::string header(header_len, '\0');
    fd.read_at(header.data(), header_len, base + prefix);

    NpyArray a;
    a.path = path;
    NpyHeaderParser(header, who).parse(a);

    std::string& d = a.descr;
    if (d.size() >= 2 && d[1] == 'O')
        throw UserError(who + ": dtype '" + d + "' holds Python objects, which cannot be read without Python; "
                              "save a numeric array (float32, uint8 or int64)");
    // numpy writes '<' or '|'; accept any order marker that means the same bytes on this host.
    std::string little = d;
    if (d.size() >= 3 && (d[0] == '<' || d[0] == '|' || d[0] == '=' || d[0] == '>'))
        little[0] = d.substr(2) == "1" ? '|' : '<';  // byte order means nothing for one byte
    if (!known_descr(little))
        throw UserError(who + ": dtype '" + d + "' is not supported; save the examples as float32, uint8 or int64");
    if (d[0] == '>' && little[0] == '<')
        throw UserError(who + ": dtype '" + d + "' is big-endian; save it little-endian, e.g. numpy.save(path, "
                              "a.astype('" + little + "'))");
    d = little;
    if (a.fortran)
        throw UserError(who + ": the array is in Fortran order; save numpy.ascontiguousarray(a) instead");
    a.itemsize = static_cast<size_t>(std::atoi(d.c_str() + 2));
    a.data_offset = base + prefix + header_len;

    // Overflow-checked size, so a corrupt shape cannot pass the bounds check by wrapping around. A zero
    // dimension makes the array empty, but readers still multiply the others (row sizes, target counts):
    // their product must fit int64 too, as numpy requires.
    uint64_t nbytes = a.itemsize, nonzero = a.itemsize;
    for (int64_t dim : a.shape) {
        if (dim < 0) throw UserError(who + ": negative dimension in the shape; save the array with numpy.save");
        if (dim != 0 && nonzero > uint64_t(std::numeric_limits<int64_t>::max()) / static_cast<uint64_t>(dim))
            throw UserError(who + ": the shape is too large; the header is corrupt");
        if (dim != 0) nonzero *= static_cast<uint64_t>(dim);
        nbytes *= static_cast<uint64_t>(dim);
    }
    if (nbytes > avail - prefix - header_len)
        throw UserError(who + ": holds " + std::to_string(avail - prefix - header_len) + " data bytes but its shape needs " +
                        std::to_string(nbytes) + "; the file is truncated: copy it again");
    return a;
}

}  // namespace detail

inline NpyArray npy_open(const std::string& path) {
    detail::Fd fd(path);
    return detail::read_npy_header(fd, path, path, 0, fd.size());
}

// np.savez writes a ZIP archive of "<name>.npy" members, STORED, so each array lies uncompressed at a
// fixed offset and can be read in place. Only the central directory is parsed (it is authoritative;
// local headers may omit sizes), plus each member's local header for the length of its name and extra
// field, which precede the data.
inline std::map<std::string, NpyArray> npz_parse(const detail::Source& fd, const std::string& path) {
    const uint64_t file_size = fd.size();
    auto not_zip = [&](const std::string& why) {
        return UserError(path + ": not a .npz file (" + why + "); save the arrays with numpy.savez");
    };
    using detail::le16;
    using detail::le32;
    using detail::le64;

    // The end-of-central-directory record is 22 bytes plus a comment of up to 65535: search that tail.
    const uint64_t tail_len = std::min<uint64_t>(file_size, 22 + 65535);
    std::vector<uint8_t> tail(tail_len);
    fd.read_at(tail.data(), tail.size(), file_size - tail_len);
    int64_t eocd = -1;
    for (int64_t i = static_cast<int64_t>(tail_len) - 22; i >= 0; --i) {
        const uint8_t* p = tail.data() + i;
        // Require the comment to end exactly at the end of the file, so a signature inside the comment
        // (or inside array data) is not mistaken for the record.
        if (le32(p) == 0x06054b50 && i + 22 + le16(p + 20) == static_cast<int64_t>(tail_len)) {
            eocd = i;
            break;
        }
    }
    if (eocd < 0) throw not_zip("no end-of-central-directory record");
    const uint8_t* e = tail.data() + eocd;
    const uint64_t eocd_pos = file_size - tail_len + static_cast<uint64_t>(eocd);
    uint64_t entries = le16(e + 10), cd_size = le32(e + 12), cd_offset = le32(e + 16);
    if (le16(e + 4) != 0 || le16(e + 6) != 0) throw not_zip("a multi-part archive");

    // ZIP64: the locator sits just before the classic record and points at the 64-bit record.
    if (eocd_pos >= 20) {
        uint8_t loc[20];
        fd.read_at(loc, sizeof loc, eocd_pos - 20);
        if (le32(loc) == 0x07064b50) {
            uint64_t z = le64(loc + 8);
            uint8_t rec[56];
            if (z + sizeof rec > eocd_pos) throw not_zip("bad zip64 locator");
            fd.read_at(rec, sizeof rec, z);
            if (le32(rec) != 0x06064b50) throw not_zip("bad zip64 end record");
            entries = le64(rec + 32);
            cd_size = le64(rec + 40);
            cd_offset = le64(rec + 48);
        }
    }
    if (cd_offset > eocd_pos || cd_size > eocd_pos - cd_offset) throw not_zip("bad central directory bounds");
    // An .npz holds a handful of arrays; a directory of more than 64 MiB is corruption, not data.
    if (cd_size > (64u << 20)) throw not_zip("central directory too large");
    std::vector<uint8_t> cd(cd_size);
    fd.read_at(cd.data(), cd.size(), cd_offset);

    std::map<std::string, NpyArray> out;
    size_t pos = 0;
    for (uint64_t n = 0; n < entries; ++n) {
        if (pos + 46 > cd.size() || le32(&cd[pos]) != 0x02014b50) throw not_zip("bad central directory entry");
        const uint8_t* h = &cd[pos];
        uint16_t flags = le16(h + 8), method = le16(h + 10);
        uint64_t comp_size = le32(h + 20), size = le32(h + 24);
        size_t name_len = le16(h + 28), extra_len = le16(h + 30), comment_len = le16(h + 32);
        uint64_t local = le32(h + 42);
        if (pos + 46 + name_len + extra_len + comment_len > cd.size()) throw not_zip("bad central directory entry");
        std::string name(reinterpret_cast<const char*>(h + 46), name_len);

        // ZIP64 extra field (id 1): 64-bit values for exactly those 32-bit fields that hold 0xFFFFFFFF,
        // in the order size, compressed size, local header offset.
        const uint8_t* x = h + 46 + name_len;
        for (size_t off = 0; off + 4 <= extra_len;) {
            uint16_t id = le16(x + off), len = le16(x + off + 2);
            if (off + 4 + len > extra_len) break;
            if (id == 0x0001) {
                const uint8_t* f = x + off + 4;
                const uint8_t* end = f + len;
                if (size == 0xFFFFFFFF && f + 8 <= end) size = le64(f), f += 8;
                if (comp_size == 0xFFFFFFFF && f + 8 <= end) comp_size = le64(f), f += 8;
                if (local == 0xFFFFFFFF && f + 8 <= end) local = le64(f), f += 8;
            }
            off += 4 + len;
        }
        pos += 46 + name_len + extra_len + comment_len;

        // Anything else in the archive (numpy writes nothing else) is not an array: leave it alone.
        const std::string suffix = ".npy";
        if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
            continue;
        if (flags & 1) throw UserError(path + ": member " + name + " is encrypted; save the data with numpy.savez");
        if (method == 8)
            throw UserError(path + ": member " + name + " is compressed; save the data with numpy.savez (not "
                                   "savez_compressed) or as separate .npy files (x.npy and y.npy)");
        if (method != 0)
            throw UserError(path + ": member " + name + " uses zip compression method " + std::to_string(method) +
                            "; save the data with numpy.savez");
        if (comp_size != size) throw not_zip("member " + name + " has inconsistent sizes");

        uint8_t lh[30];
        if (local > cd_offset || cd_offset - local < sizeof lh) throw not_zip("bad local header offset for " + name);
        fd.read_at(lh, sizeof lh, local);
        if (le32(lh) != 0x04034b50) throw not_zip("bad local header for " + name);
        uint64_t data = local + 30 + le16(lh + 26) + le16(lh + 28);
        if (data > cd_offset || size > cd_offset - data) throw not_zip("member " + name + " runs past the directory");

        NpyArray a = detail::read_npy_header(fd, path, path + ": member " + name, data, size);
        out[name.substr(0, name.size() - suffix.size())] = std::move(a);
    }
    return out;
}

inline std::map<std::string, NpyArray> npz_open(const std::string& path) {
    return npz_parse(detail::Fd(path), path);
}

// The same parsers over bytes in memory (`name` stands for the file in messages and in NpyArray::path).
inline NpyArray npy_parse(const uint8_t* data, size_t size, const std::string& name) {
    return detail::read_npy_header(detail::Bytes(data, size, name), name, name, 0, size);
}
inline std::map<std::string, NpyArray> npz_parse(const uint8_t* data, size_t size, const std::string& name) {
    return npz_parse(detail::Bytes(data, size, name), name);
}

// Gathers rows (index along the first axis) of one array with pread on a descriptor held open.
class RowReader {
public:
    explicit RowReader(NpyArray a) : a_(std::move(a)), fd_(a_.path) {
        rows_ = a_.shape.empty() ? 1 : static_cast<size_t>(a_.shape[0]);
        row_bytes_ = a_.itemsize;
        for (size_t i = 1; i < a_.shape.size(); ++i) row_bytes_ *= static_cast<size_t>(a_.shape[i]);
    }

    const NpyArray& array() const { return a_; }
    size_t rows() const { return rows_; }
    size_t row_bytes() const { return row_bytes_; }

    // Any order, repeats allowed; out receives n * row_bytes() bytes. Ascending runs (a sequential
    // epoch, or a sorted batch) become one read each.
    void read_rows(const int64_t* indices, size_t n, void* out) {
        auto* dst = static_cast<char*>(out);
        for (size_t i = 0; i < n;) {
            check(indices[i]);
            size_t run = 1;
            while (i + run < n && indices[i + run] == indices[i] + static_cast<int64_t>(run)) {
                check(indices[i + run]);
                ++run;
            }
            size_t bytes = run * row_bytes_;
            if (bytes) fd_.read_at(dst, bytes, a_.data_offset + static_cast<uint64_t>(indices[i]) * row_bytes_);
            dst += bytes;
            i += run;
        }
    }

private:
    NpyArray a_;
    detail::Fd fd_;
    size_t rows_ = 0;
    size_t row_bytes_ = 0;

    void check(int64_t row) const {
        if (row < 0 || static_cast<uint64_t>(row) >= rows_)
            throw UserError(a_.path + ": row " + std::to_string(row) + " is out of range (the array has " +
                            std::to_string(rows_) + " rows)");
    }
};

namespace detail {

template <class S, class D>
void convert_values(const void* src, size_t count, void* dst, const std::string& descr) {
    const auto* s = static_cast<const char*>(src);
    auto* d = static_cast<D*>(dst);
    for (size_t i = 0; i < count; ++i) {
        S v;
        std::memcpy(&v, s + i * sizeof(S), sizeof(S));  // the data in a file need not be aligned
        if constexpr (std::is_same_v<D, int64_t>) {
            if constexpr (std::is_floating_point_v<S>) {
                // Labels stored as floats: only whole numbers mean a class; 2.5 is a bug upstream.
                if (!(std::floor(v) == v && v >= -9223372036854775808.0 && v < 9223372036854775808.0)) {
                    char buf[64];
                    std::snprintf(buf, sizeof buf, "%.17g", static_cast<double>(v));
                    throw UserError(std::string("value ") + buf + " in a '" + descr +
                                    "' array is not an integer; save labels as int64");
                }
            } else if constexpr (std::is_same_v<S, uint64_t>) {
                if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                    throw UserError("value " + std::to_string(v) + " in a '" + descr +
                                    "' array does not fit int64; save labels as int64");
            }
        }
        d[i] = static_cast<D>(v);
    }
}

template <class D>
void convert_to(const std::string& descr, const void* src, size_t count, void* dst) {
    if (descr == "<f4") return convert_values<float, D>(src, count, dst, descr);
    if (descr == "<f8") return convert_values<double, D>(src, count, dst, descr);
    if (descr == "|u1" || descr == "|b1") return convert_values<uint8_t, D>(src, count, dst, descr);
    if (descr == "|i1") return convert_values<int8_t, D>(src, count, dst, descr);
    if (descr == "<i2") return convert_values<int16_t, D>(src, count, dst, descr);
    if (descr == "<u2") return convert_values<uint16_t, D>(src, count, dst, descr);
    if (descr == "<i4") return convert_values<int32_t, D>(src, count, dst, descr);
    if (descr == "<u4") return convert_values<uint32_t, D>(src, count, dst, descr);
    if (descr == "<i8") return convert_values<int64_t, D>(src, count, dst, descr);
    if (descr == "<u8") return convert_values<uint64_t, D>(src, count, dst, descr);
    throw UserError("dtype '" + descr + "' is not supported; save the examples as float32, uint8 or int64");
}

}  // namespace detail

// Converts count_values values of dtype `descr` (as in NpyArray::descr) to "float32" or "int64".
inline void convert_rows(const std::string& descr, const void* src, size_t count_values, const std::string& to,
                         void* dst) {
    if (to == "float32") return detail::convert_to<float>(descr, src, count_values, dst);
    if (to == "int64") return detail::convert_to<int64_t>(descr, src, count_values, dst);
    throw UserError("cannot convert to '" + to + "'; the trainer reads float32 or int64");
}

// Float32 values in pieces (pointer, count) that a file holds one after another: what a trainer uploads,
// read in place from the memory that holds it instead of gathered into one copy of the model.
using FloatPieces = std::vector<std::pair<const float*, size_t>>;

// A 1-D float32 .npy as numpy.save writes it (format 1.0, header padded so the data starts at a multiple
// of 64 bytes). Written beside the target and renamed over it, so a reader never sees half a file.
inline void npy_write_f32(const std::string& path, const FloatPieces& pieces) {
    size_t n = 0;
    for (const auto& piece : pieces) n += piece.second;
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(n) + ",), }";
    const size_t prefix = 10;  // magic (6) + version (2) + header length (2)
    header.append(63 - (prefix + header.size()) % 64, ' ');
    header += '\n';
    uint8_t pre[prefix] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(header.size() & 0xff),
                           static_cast<uint8_t>(header.size() >> 8)};

    const std::string tmp = path + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw UserError(path + ": cannot write (" + std::strerror(errno) + ")");
    bool ok = std::fwrite(pre, 1, prefix, f) == prefix &&
              std::fwrite(header.data(), 1, header.size(), f) == header.size();
    for (const auto& piece : pieces) ok = ok && std::fwrite(piece.first, sizeof(float), piece.second, f) == piece.second;
    int err = errno;
    ok = (std::fclose(f) == 0) && ok;
    if (ok && std::rename(tmp.c_str(), path.c_str()) != 0) {
        ok = false;
        err = errno;
    }
    if (!ok) {
        std::remove(tmp.c_str());
        throw UserError(path + ": write failed (" + std::strerror(err ? err : errno) + "); check the free space");
    }
}

inline void npy_write_f32(const std::string& path, const float* data, size_t n) {
    npy_write_f32(path, FloatPieces{{data, n}});
}

}  // namespace edgefl
