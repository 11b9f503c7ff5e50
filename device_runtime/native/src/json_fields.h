// JSON for the trainer: nlohmann::json (Debian nlohmann-json3-dev, header-only) to parse a manifest and
// write the report, plus the checks a document from outside needs. A syntax error, or a field that is
// missing or of the wrong type, is one UserError line naming the file (the caller's `where`) and the field
// by its path ("optimizer.betas[1]").
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "errors.h"

namespace edgefl {

// Keys keep the order they were set in, so the report reads in the order main() writes it.
using Json = nlohmann::ordered_json;

namespace detail {

// A parser message made safe for one line of a terminal: control and non-ASCII bytes as \xNN, and short.
inline std::string printable(const std::string& s, size_t limit = 160) {
    std::string out;
    for (unsigned char c : s) {
        if (out.size() >= limit) return out + "...";
        if (c >= 0x20 && c < 0x7f) {
            out += static_cast<char>(c);
        } else {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        }
    }
    return out;
}

// Deep enough for any real document; deeper is refused, so nothing later recurses without bound.
constexpr int kMaxJsonDepth = 256;

}  // namespace detail

// Parses `size` bytes of JSON text; `where` (the file) starts every error message.
inline Json parse_json(const char* data, size_t size, const std::string& where) {
    auto not_json = [&](const std::string& what) { return UserError(where + ": not JSON (" + what + ")"); };
    const auto depth_limit = [](int depth, Json::parse_event_t event, Json&) {
        if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
            depth >= detail::kMaxJsonDepth)
            throw std::length_error("nesting");
        return true;
    };
    try {
        return Json::parse(data, data + size, depth_limit);
    } catch (const Json::parse_error& e) {
        // what(): "[json.exception.parse_error.101] parse error at line 1, column 9: <reason>"; e.byte counts
        // the bytes read including the offending one, so the offset of that byte is one less.
        std::string what = e.what();
        const size_t column = what.find("column ");
        const size_t colon = what.find(": ", column == std::string::npos ? 0 : column);
        if (colon != std::string::npos) what = what.substr(colon + 2);
        throw not_json(detail::printable(what) + " at byte " + std::to_string(e.byte ? e.byte - 1 : 0));
    } catch (const Json::out_of_range&) {
        throw not_json("a number out of range");
    } catch (const std::length_error&) {
        throw not_json("nesting deeper than " + std::to_string(detail::kMaxJsonDepth));
    }
}

inline Json parse_json(const std::string& text, const std::string& where) {
    return parse_json(text.data(), text.size(), where);
}

// A read-only view of one value of a parsed document and its path from the root. Reading a field that is
// missing, or has another type than asked for, throws a UserError "<path>: <problem>"; callers prefix
// the file name.
class Field {
public:
    Field(const Json& value, std::string path = "") : v_(&value), path_(std::move(path)) {}

    const Json& json() const { return *v_; }
    const std::string& path() const { return path_; }

    bool has(const std::string& key) const { return object().contains(key); }
    Field operator[](const std::string& key) const {
        const Json& o = object();
        const auto it = o.find(key);
        const std::string path = path_.empty() ? key : path_ + "." + key;
        if (it == o.end()) throw UserError(path + ": missing");
        return Field(*it, path);
    }
    Field operator[](size_t index) const {
        const Json& a = array();
        const std::string path = path_ + "[" + std::to_string(index) + "]";
        if (index >= a.size())
            throw UserError(path + ": missing (the array has " + std::to_string(a.size()) + " entries)");
        return Field(a[index], path);
    }
    size_t size() const { return array().size(); }

    bool is_null() const { return v_->is_null(); }
    bool is_string() const { return v_->is_string(); }
    const std::string& as_string() const {
        if (!v_->is_string()) wrong("a string");
        return v_->get_ref<const std::string&>();
    }
    double as_double() const {
        if (!v_->is_number()) wrong("a number");
        return v_->get<double>();
    }
    int64_t as_int64() const {
        if (v_->is_number_unsigned()) {
            const uint64_t u = v_->get<uint64_t>();
            if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return static_cast<int64_t>(u);
        } else if (v_->is_number_integer()) {
            return v_->get<int64_t>();
        } else if (v_->is_number_float()) {
            // A writer may have printed a count as 3.0 or 1e3: any double that is exactly an integer will do.
            const double d = v_->get<double>();
            if (std::isfinite(d) && std::floor(d) == d && d >= -9223372036854775808.0 && d < 9223372036854775808.0)
                return static_cast<int64_t>(d);
        }
        wrong("an integer");
    }

private:
    const Json* v_;
    std::string path_;

    [[noreturn]] void wrong(const char* expected) const {
        const std::string found = v_->is_number() ? v_->dump() : std::string(v_->type_name());
        throw UserError((path_.empty() ? std::string("the document") : path_) + ": expected " + expected +
                        ", found " + detail::printable(found, 40));
    }
    const Json& object() const {
        if (!v_->is_object()) wrong("an object");
        return *v_;
    }
    const Json& array() const {
        if (!v_->is_array()) wrong("an array");
        return *v_;
    }
};

}  // namespace edgefl
