// A minimal JSON value, parser and writer: enough for the trainer's plan and its report, no more.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "errors.h"

namespace edgefl {

class Json {
public:
    enum class Type { Null, Bool, Number, String, Array, Object };
    using Member = std::pair<std::string, Json>;

    Json() = default;
    Json(std::nullptr_t) {}
    Json(bool b) : type_(Type::Bool), bool_(b) {}
    Json(double d) : type_(Type::Number), double_(d) {}
    // Any integer type: without the template, Json(3) would be ambiguous between double, int64 and bool.
    template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
    Json(T v) : type_(Type::Number) {
        if (std::is_unsigned_v<T> && static_cast<uint64_t>(v) > uint64_t(std::numeric_limits<int64_t>::max())) {
            double_ = static_cast<double>(v);  // beyond int64: kept as the nearest double
        } else {
            integer_ = true;
            int_ = static_cast<int64_t>(v);
            double_ = static_cast<double>(v);
        }
    }
    Json(const char* s) : type_(Type::String), string_(s) {}
    Json(std::string s) : type_(Type::String), string_(std::move(s)) {}
    Json(std::vector<Json> a) : type_(Type::Array), array_(std::move(a)) {}

    static Json object() {
        Json j;
        j.type_ = Type::Object;
        return j;
    }
    static Json array() { return Json(std::vector<Json>{}); }

    // Replaces an existing key in place, so the writer keeps the order in which keys first appeared.
    Json& set(const std::string& key, Json value) {
        expect(Type::Object);
        for (auto& m : object_)
            if (m.first == key) {
                m.second = std::move(value);
                return *this;
            }
        object_.emplace_back(key, std::move(value));
        return *this;
    }
    Json& push_back(Json value) {
        expect(Type::Array);
        array_.push_back(std::move(value));
        return *this;
    }

    Type type() const { return type_; }
    bool is_null() const { return type_ == Type::Null; }
    bool is_bool() const { return type_ == Type::Bool; }
    bool is_number() const { return type_ == Type::Number; }
    bool is_integer() const { return type_ == Type::Number && integer_; }
    bool is_string() const { return type_ == Type::String; }
    bool is_array() const { return type_ == Type::Array; }
    bool is_object() const { return type_ == Type::Object; }

    bool as_bool() const { return expect(Type::Bool), bool_; }
    double as_double() const { return expect(Type::Number), integer_ ? static_cast<double>(int_) : double_; }
    const std::string& as_string() const { return expect(Type::String), string_; }
    int64_t as_int64() const {
        expect(Type::Number);
        if (integer_) return int_;
        // A writer may have printed a count as 3.0 or 1e3: accept any double that is exactly an integer.
        if (std::isfinite(double_) && std::floor(double_) == double_ && double_ >= -9223372036854775808.0 &&
            double_ < 9223372036854775808.0)
            return static_cast<int64_t>(double_);
        throw UserError("expected an integer, found " + dump());
    }

    size_t size() const {
        if (type_ == Type::Array) return array_.size();
        if (type_ == Type::Object) return object_.size();
        throw UserError("expected an array or an object, found " + type_name(type_));
    }
    // Linear search: the documents are small, and a vector keeps insertion order without a second index.
    bool has(const std::string& key) const { return find(key) != nullptr; }
    const Json& operator[](const std::string& key) const {
        if (const Json* v = find(key)) return *v;
        throw UserError(key + ": missing");
    }
    const Json& operator[](const char* key) const { return (*this)[std::string(key)]; }
    // A template, so that j[0] is an exact match instead of a tie with the null-pointer const char*.
    template <class I, std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>, int> = 0>
    const Json& operator[](I index) const {
        expect(Type::Array);
        if constexpr (std::is_signed_v<I>)
            if (index < 0) throw UserError("negative index " + std::to_string(index) + " into an array");
        auto i = static_cast<size_t>(index);
        if (i >= array_.size())
            throw UserError("index " + std::to_string(i) + " is past the end of an array of " +
                            std::to_string(array_.size()));
        return array_[i];
    }
    const std::vector<Member>& items() const { return expect(Type::Object), object_; }
    const std::vector<Json>& elements() const { return expect(Type::Array), array_; }
    std::vector<Json>::const_iterator begin() const { return elements().begin(); }
    std::vector<Json>::const_iterator end() const { return elements().end(); }

    static Json parse(const std::string& text, const std::string& where);

    std::string dump() const {
        std::string out;
        dump_to(out);
        return out;
    }

    static std::string type_name(Type t) {
        switch (t) {
            case Type::Null: return "null";
            case Type::Bool: return "a boolean";
            case Type::Number: return "a number";
            case Type::String: return "a string";
            case Type::Array: return "an array";
            case Type::Object: return "an object";
        }
        return "?";
    }

private:
    Type type_ = Type::Null;
    bool bool_ = false;
    bool integer_ = false;  // an integer literal that fits int64: kept exact, since a double loses past 2^53
    int64_t int_ = 0;
    double double_ = 0;
    std::string string_;
    std::vector<Json> array_;
    std::vector<Member> object_;

    friend class JsonParser;

    void expect(Type t) const {
        if (type_ != t) throw UserError("expected " + type_name(t) + ", found " + type_name(type_));
    }
    const Json* find(const std::string& key) const {
        expect(Type::Object);
        for (const auto& m : object_)
            if (m.first == key) return &m.second;
        return nullptr;
    }

    static void dump_string(const std::string& s, std::string& out) {
        static const char hex[] = "0123456789abcdef";
        out += '"';
        for (unsigned char c : s) {
            switch (c) {
                case '"': out += "\\\""; break;
                case '\\': out += "\\\\"; break;
                case '\b': out += "\\b"; break;
                case '\f': out += "\\f"; break;
                case '\n': out += "\\n"; break;
                case '\r': out += "\\r"; break;
                case '\t': out += "\\t"; break;
                default:
                    if (c < 0x20) {
                        out += "\\u00";
                        out += hex[c >> 4];
                        out += hex[c & 15];
                    } else {
                        out += static_cast<char>(c);  // UTF-8 passes through: JSON text is UTF-8
                    }
            }
        }
        out += '"';
    }

    void dump_to(std::string& out) const {
        switch (type_) {
            case Type::Null: out += "null"; break;
            case Type::Bool: out += bool_ ? "true" : "false"; break;
            case Type::Number: {
                if (integer_) {
                    out += std::to_string(int_);
                } else if (!std::isfinite(double_)) {
                    out += "null";  // JSON has no NaN or infinity; readers choke on Python's NaN extension
                } else {
                    // 17 significant digits (printf's %.17g): every double reads back bit-exact. to_chars,
                    // unlike snprintf, ignores the locale, so a decimal comma can never appear.
                    char buf[40];
                    auto r = std::to_chars(buf, buf + sizeof buf, double_, std::chars_format::general, 17);
                    out.append(buf, r.ptr);
                }
                break;
            }
            case Type::String: dump_string(string_, out); break;
            case Type::Array:
                out += '[';
                for (size_t i = 0; i < array_.size(); ++i) {
                    if (i) out += ',';
                    array_[i].dump_to(out);
                }
                out += ']';
                break;
            case Type::Object:
                out += '{';
                for (size_t i = 0; i < object_.size(); ++i) {
                    if (i) out += ',';
                    dump_string(object_[i].first, out);
                    out += ':';
                    object_[i].second.dump_to(out);
                }
                out += '}';
                break;
        }
    }
};

class JsonParser {
public:
    JsonParser(const std::string& text, const std::string& where) : s_(text), where_(where) {}

    Json parse_document() {
        skip_ws();
        Json v = parse_value(0);
        skip_ws();
        if (pos_ != s_.size()) fail("unexpected " + describe_here() + " after the value");
        return v;
    }

private:
    // Deep enough for any real document; the limit turns a hostile "[[[[..." into an error rather than a
    // stack overflow (the board's main thread stack is small).
    static constexpr int kMaxDepth = 256;

    const std::string& s_;
    const std::string& where_;
    size_t pos_ = 0;

    [[noreturn]] void fail(const std::string& what) const {
        throw UserError(where_ + ": not JSON (" + what + " at byte " + std::to_string(pos_) + ")");
    }
    std::string describe_here() const {
        if (pos_ >= s_.size()) return "end of text";
        unsigned char c = static_cast<unsigned char>(s_[pos_]);
        if (c >= 0x20 && c < 0x7f) return std::string("'") + static_cast<char>(c) + "'";
        char buf[16];
        std::snprintf(buf, sizeof buf, "byte 0x%02x", c);
        return buf;
    }
    void skip_ws() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
            ++pos_;
    }
    bool consume_literal(const char* lit) {
        size_t n = std::strlen(lit);
        if (s_.compare(pos_, n, lit) != 0) return false;
        pos_ += n;
        return true;
    }

    Json parse_value(int depth) {
        if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
        if (pos_ >= s_.size()) fail("unexpected end of text");
        char c = s_[pos_];
        if (c == '{') return parse_object(depth);
        if (c == '[') return parse_array(depth);
        if (c == '"') return Json(parse_string());
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
        if (consume_literal("true")) return Json(true);
        if (consume_literal("false")) return Json(false);
        if (consume_literal("null")) return Json();
        fail("unexpected " + describe_here());
    }

    Json parse_object(int depth) {
        Json obj = Json::object();
        ++pos_;  // '{'
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == '}') {
            ++pos_;
            return obj;
        }
        for (;;) {
            skip_ws();
            if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a key, found " + describe_here());
            std::string key = parse_string();
            skip_ws();
            if (pos_ >= s_.size() || s_[pos_] != ':') fail("expected ':', found " + describe_here());
            ++pos_;
            skip_ws();
            obj.set(key, parse_value(depth + 1));  // a repeated key keeps the last value, as Python does
            skip_ws();
            if (pos_ < s_.size() && s_[pos_] == ',') {
                ++pos_;
                continue;
            }
            if (pos_ < s_.size() && s_[pos_] == '}') {
                ++pos_;
                return obj;
            }
            fail("expected ',' or '}', found " + describe_here());
        }
    }

    Json parse_array(int depth) {
        std::vector<Json> items;
        ++pos_;  // '['
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ']') {
            ++pos_;
            return Json(std::move(items));
        }
        for (;;) {
            skip_ws();
            items.push_back(parse_value(depth + 1));
            skip_ws();
            if (pos_ < s_.size() && s_[pos_] == ',') {
                ++pos_;
                continue;
            }
            if (pos_ < s_.size() && s_[pos_] == ']') {
                ++pos_;
                return Json(std::move(items));
            }
            fail("expected ',' or ']', found " + describe_here());
        }
    }

    Json parse_number() {
        // Check the JSON grammar first: from_chars alone would accept "01", "1." or "inf".
        size_t start = pos_;
        auto digit = [&] { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; };
        if (s_[pos_] == '-') ++pos_;
        if (!digit()) fail("expected a digit, found " + describe_here());
        if (s_[pos_] == '0') {
            ++pos_;
        } else {
            while (digit()) ++pos_;
        }
        bool integral = true;
        if (pos_ < s_.size() && s_[pos_] == '.') {
            integral = false;
            ++pos_;
            if (!digit()) fail("expected a digit, found " + describe_here());
            while (digit()) ++pos_;
        }
        if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
            integral = false;
            ++pos_;
            if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
            if (!digit()) fail("expected a digit, found " + describe_here());
            while (digit()) ++pos_;
        }
        const char* first = s_.data() + start;
        const char* last = s_.data() + pos_;
        if (integral) {
            int64_t v = 0;
            auto r = std::from_chars(first, last, v);
            if (r.ec == std::errc() && r.ptr == last) return Json(v);
            // Past int64: fall through to the nearest double rather than refuse the document.
        }
        double d = 0;
        auto r = std::from_chars(first, last, d);
        if (r.ptr != last) fail("bad number");
        // Out of range (1e999, 1e-999): from_chars leaves d untouched, so decide between overflow (±inf,
        // as Python reads it) and underflow (±0) from the decimal magnitude of the first nonzero digit.
        if (r.ec == std::errc::result_out_of_range) d = out_of_range_value(first, last);
        return Json(d);
    }

    static double out_of_range_value(const char* p, const char* last) {
        bool neg = *p == '-';
        if (neg) ++p;
        int64_t magnitude = 0, exp = 0;
        bool seen_nonzero = false, in_fraction = false;
        for (; p < last && *p != 'e' && *p != 'E'; ++p) {
            if (*p == '.') {
                in_fraction = true;
            } else if (seen_nonzero) {
                if (!in_fraction) ++magnitude;
            } else if (*p != '0') {
                seen_nonzero = true;
                if (in_fraction) --magnitude;  // 0.001 is 1e-3
            } else if (in_fraction) {
                --magnitude;
            }
        }
        if (p < last) {  // exponent, saturated: only its sign and rough size matter here
            ++p;
            bool eneg = *p == '-';
            if (*p == '+' || *p == '-') ++p;
            for (; p < last; ++p) exp = std::min<int64_t>(exp * 10 + (*p - '0'), int64_t(1) << 40);
            if (eneg) exp = -exp;
        }
        double v = seen_nonzero && magnitude + exp > 0 ? HUGE_VAL : 0.0;
        return neg ? -v : v;
    }

    unsigned parse_hex4() {
        if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
        unsigned v = 0;
        for (int i = 0; i < 4; ++i) {
            char c = s_[pos_++];
            v <<= 4;
            if (c >= '0' && c <= '9') v |= unsigned(c - '0');
            else if (c >= 'a' && c <= 'f') v |= unsigned(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') v |= unsigned(c - 'A' + 10);
            else {
                --pos_;
                fail("bad \\u escape");
            }
        }
        return v;
    }

    static void append_utf8(std::string& out, uint32_t cp) {
        if (cp < 0x80) {
            out += static_cast<char>(cp);
        } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        }
    }

    std::string parse_string() {
        ++pos_;  // opening quote
        std::string out;
        for (;;) {
            if (pos_ >= s_.size()) fail("unterminated string");
            unsigned char c = static_cast<unsigned char>(s_[pos_]);
            if (c == '"') {
                ++pos_;
                return out;
            }
            if (c < 0x20) fail("raw control character in a string");
            if (c != '\\') {
                out += static_cast<char>(c);
                ++pos_;
                continue;
            }
            ++pos_;
            if (pos_ >= s_.size()) fail("unterminated string");
            char e = s_[pos_++];
            switch (e) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    uint32_t cp = parse_hex4();
                    // Characters past the BMP arrive as a UTF-16 surrogate pair (Python's ensure_ascii
                    // writes emoji so); a lone surrogate has no UTF-8 form.
                    if (cp >= 0xD800 && cp <= 0xDBFF) {
                        if (s_.compare(pos_, 2, "\\u") != 0) fail("lone surrogate in a \\u escape");
                        pos_ += 2;
                        uint32_t lo = parse_hex4();
                        if (lo < 0xDC00 || lo > 0xDFFF) fail("lone surrogate in a \\u escape");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                        fail("lone surrogate in a \\u escape");
                    }
                    append_utf8(out, cp);
                    break;
                }
                default:
                    --pos_;
                    fail("bad escape");
            }
        }
    }
};

inline Json Json::parse(const std::string& text, const std::string& where) {
    return JsonParser(text, where).parse_document();
}

}  // namespace edgefl
