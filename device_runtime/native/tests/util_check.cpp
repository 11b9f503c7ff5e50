// Drives the header-only utilities from the command line so that tests/unit/test_native_utils.py can
// compare them with numpy, hashlib and json. One subcommand per utility; output is plain text.
//
//   util_check perm SEED N...            one line per N: successive permutation(N) calls on one generator
//   util_check raw SEED K                K next_uint64 values, one per line
//   util_check sha256 FILE               hex digest
//   util_check json FILE                 parse, then dump
//   util_check manifest FOLDER           read FOLDER/manifest.json as a suffix's (no file checks), print "ok"
//   util_check npy FILE TO               header line, then every row converted to TO (float32 | int64)
//   util_check npz FILE                  one header line per member
//   util_check npz FILE NAME TO ROW...   the given rows of member NAME, converted to TO, one line each
//   util_check write OUT N               0..N-1 as a float32 .npy
//
// A UserError is printed on stderr and exits with status 2, as the trainer does.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "artifact_set.h"
#include "errors.h"
#include "json_fields.h"
#include "npy.h"
#include "numpy_random.h"
#include "sha256.h"

namespace {

using edgefl::NpyArray;

[[noreturn]] void usage() {
    std::fprintf(stderr, "usage: util_check perm|raw|sha256|json|manifest|npy|npz|write ARGS... (see the source)\n");
    std::exit(64);
}

std::string header_line(const NpyArray& a) {
    std::string shape;
    for (size_t i = 0; i < a.shape.size(); ++i) shape += (i ? "," : "") + std::to_string(a.shape[i]);
    return "descr=" + a.descr + " shape=" + shape + " fortran=" + (a.fortran ? "1" : "0") +
           " offset=" + std::to_string(a.data_offset) + " itemsize=" + std::to_string(a.itemsize);
}

// Prints rows converted to `to`: floats with 9 significant digits, enough to round-trip a float32.
void print_rows(edgefl::RowReader& r, const std::vector<int64_t>& rows, const std::string& to) {
    const NpyArray& a = r.array();
    size_t per_row = r.row_bytes() / a.itemsize;
    std::vector<char> raw(rows.size() * r.row_bytes());
    r.read_rows(rows.data(), rows.size(), raw.data());
    std::vector<float> f(rows.size() * per_row);
    std::vector<int64_t> q(rows.size() * per_row);
    if (to == "float32") edgefl::convert_rows(a.descr, raw.data(), f.size(), to, f.data());
    else edgefl::convert_rows(a.descr, raw.data(), q.size(), to, q.data());
    for (size_t i = 0; i < rows.size(); ++i) {
        std::string line;
        char buf[40];
        for (size_t j = 0; j < per_row; ++j) {
            if (to == "float32") std::snprintf(buf, sizeof buf, "%.9g", double(f[i * per_row + j]));
            else std::snprintf(buf, sizeof buf, "%" PRId64, q[i * per_row + j]);
            line += (j ? " " : "") + std::string(buf);
        }
        std::puts(line.c_str());
    }
}

int run(int argc, char** argv) {
    if (argc < 2) usage();
    std::string cmd = argv[1];
    std::vector<std::string> args(argv + 2, argv + argc);

    if (cmd == "perm" && args.size() >= 2) {
        edgefl::NumpyGenerator g(std::strtoull(args[0].c_str(), nullptr, 10));
        std::string line;
        for (size_t k = 1; k < args.size(); ++k) {
            line.clear();
            for (int64_t v : g.permutation(std::strtoll(args[k].c_str(), nullptr, 10)))
                line += std::to_string(v) + ' ';
            std::puts(line.c_str());
        }
        return 0;
    }
    if (cmd == "raw" && args.size() == 2) {
        edgefl::NumpyGenerator g(std::strtoull(args[0].c_str(), nullptr, 10));
        for (long k = std::strtol(args[1].c_str(), nullptr, 10); k > 0; --k)
            std::printf("%" PRIu64 "\n", g.next_uint64());
        return 0;
    }
    if (cmd == "sha256" && args.size() == 1) {
        std::puts(edgefl::sha256_file(args[0]).c_str());
        return 0;
    }
    if (cmd == "json" && args.size() == 1) {
        std::ifstream in(args[0], std::ios::binary);
        if (!in) throw edgefl::UserError(args[0] + ": cannot open");
        std::stringstream ss;
        ss << in.rdbuf();
        std::puts(edgefl::parse_json(ss.str(), args[0]).dump().c_str());
        return 0;
    }
    if (cmd == "manifest" && args.size() == 1) {
        std::ifstream in(args[0] + "/manifest.json", std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        const std::string text = ss.str();
        edgefl::ArtifactSet set;
        set.suffix = edgefl::parse_manifest(text.data(), text.size(), args[0]);
        edgefl::read_suffix_fields(set);
        std::puts("ok");
        return 0;
    }
    if (cmd == "npy" && args.size() == 2) {
        edgefl::RowReader r(edgefl::npy_open(args[0]));
        std::puts(header_line(r.array()).c_str());
        std::vector<int64_t> all(r.rows());
        for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
        print_rows(r, all, args[1]);
        return 0;
    }
    if (cmd == "npz" && args.size() == 1) {
        for (const auto& [name, a] : edgefl::npz_open(args[0])) std::printf("%s %s\n", name.c_str(), header_line(a).c_str());
        return 0;
    }
    if (cmd == "npz" && args.size() >= 3) {
        auto members = edgefl::npz_open(args[0]);
        auto it = members.find(args[1]);
        if (it == members.end()) throw edgefl::UserError(args[0] + ": no member " + args[1] + ".npy");
        edgefl::RowReader r(it->second);
        std::vector<int64_t> rows;
        for (size_t k = 3; k < args.size(); ++k) rows.push_back(std::strtoll(args[k].c_str(), nullptr, 10));
        print_rows(r, rows, args[2]);
        return 0;
    }
    if (cmd == "write" && args.size() == 2) {
        std::vector<float> v(std::strtoull(args[1].c_str(), nullptr, 10));
        for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
        edgefl::npy_write_f32(args[0], v.data(), v.size());
        return 0;
    }
    usage();
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const edgefl::UserError& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 2;
    }
}
