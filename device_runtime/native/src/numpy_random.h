// NumPy's np.random.default_rng(seed).permutation(n), bit for bit, so that the native trainer visits the
// examples in the same order as the Python trainers given the same seed (runs stay comparable and a
// device's batches can be replayed in Python).
//
// The chain, as NumPy 2.x does it:
//   SeedSequence(seed): the seed as little-endian 32-bit words, hashed into a pool of 4 words;
//   PCG64: seeded from SeedSequence.generate_state(4, uint64) = {state_hi, state_lo, inc_hi, inc_lo};
//   Generator.permutation(n): arange(n), then shuffle = Fisher-Yates from the end, each index drawn by
//   random_interval (mask rejection; 32-bit draws while the bound fits in 32 bits).
#pragma once

#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <utility>
#include <vector>

namespace edgefl {

namespace detail {

// numpy/random/bit_generator.pyx: SeedSequence with the default pool size of 4 and no spawn key.
class SeedSequence {
public:
    explicit SeedSequence(uint64_t seed) {
        // Python ints become 32-bit words, least significant first; 0 is one word, not none.
        std::vector<uint32_t> entropy{static_cast<uint32_t>(seed)};
        if (seed >> 32) entropy.push_back(static_cast<uint32_t>(seed >> 32));
        mix_entropy(entropy);
    }

    // generate_state(n_words, uint64): 2 * n_words 32-bit words, paired little-endian into 64-bit ones.
    std::vector<uint64_t> generate_state_u64(size_t n_words) const {
        uint32_t hash_const = kInitB;
        std::vector<uint64_t> out(n_words);
        for (size_t i = 0; i < 2 * n_words; ++i) {
            uint32_t v = pool_[i % kPoolSize];
            v ^= hash_const;
            hash_const *= kMultB;
            v *= hash_const;
            v ^= v >> kXShift;
            out[i / 2] |= static_cast<uint64_t>(v) << (32 * (i % 2));
        }
        return out;
    }

private:
    static constexpr size_t kPoolSize = 4;
    static constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875;
    static constexpr uint32_t kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
    static constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
    static constexpr int kXShift = 16;

    uint32_t pool_[kPoolSize] = {};

    static uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
        value ^= hash_const;
        hash_const *= kMultA;
        value *= hash_const;
        value ^= value >> kXShift;
        return value;
    }
    static uint32_t mix(uint32_t x, uint32_t y) {
        uint32_t r = kMixMultL * x - kMixMultR * y;
        return r ^ (r >> kXShift);
    }
    void mix_entropy(const std::vector<uint32_t>& entropy) {
        uint32_t hash_const = kInitA;
        for (size_t i = 0; i < kPoolSize; ++i) pool_[i] = hashmix(i < entropy.size() ? entropy[i] : 0, hash_const);
        for (size_t src = 0; src < kPoolSize; ++src)
            for (size_t dst = 0; dst < kPoolSize; ++dst)
                if (src != dst) pool_[dst] = mix(pool_[dst], hashmix(pool_[src], hash_const));
        // A 64-bit seed is at most 2 words, never more than the pool: numpy's extra-entropy loop is a no-op.
    }
};

}  // namespace detail

class NumpyGenerator {
public:
    explicit NumpyGenerator(uint64_t seed) {
        std::vector<uint64_t> s = detail::SeedSequence(seed).generate_state_u64(4);
        // numpy/random/src/pcg64: pcg64_set_seed(state, seed=s[0..1], inc=s[2..3]), high word first,
        // then the reference pcg_setseq_128_srandom_r.
        u128 initstate = (u128(s[0]) << 64) | s[1];
        u128 initseq = (u128(s[2]) << 64) | s[3];
        state_ = 0;
        inc_ = (initseq << 1) | 1;
        step();
        state_ += initstate;
        step();
    }

    // pcg64_next64: advance, then the XSL-RR output of the new state. Leaves the buffered 32-bit half
    // alone, as numpy does.
    uint64_t next_uint64() {
        step();
        uint64_t x = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
        unsigned rot = static_cast<unsigned>(state_ >> 122);
        return (x >> rot) | (x << ((64 - rot) & 63));
    }

    // pcg64_next32: each 64-bit output serves two draws, low half first.
    uint32_t next_uint32() {
        if (has_uint32_) {
            has_uint32_ = false;
            return uinteger_;
        }
        uint64_t next = next_uint64();
        has_uint32_ = true;
        uinteger_ = static_cast<uint32_t>(next >> 32);
        return static_cast<uint32_t>(next);
    }

    // numpy/random/src/distributions: random_interval, a uniform integer in [0, max].
    uint64_t random_interval(uint64_t max) {
        if (max == 0) return 0;
        uint64_t mask = max;
        mask |= mask >> 1;
        mask |= mask >> 2;
        mask |= mask >> 4;
        mask |= mask >> 8;
        mask |= mask >> 16;
        mask |= mask >> 32;
        uint64_t value;
        if (max <= 0xffffffffULL) {
            while ((value = (next_uint32() & mask)) > max) {
            }
        } else {
            while ((value = (next_uint64() & mask)) > max) {
            }
        }
        return value;
    }

    // Generator.permutation(n) = shuffle(arange(n)); shuffle is _shuffle_raw with first=1.
    std::vector<int64_t> permutation(int64_t n) {
        if (n < 0) throw std::invalid_argument("permutation: negative length");
        std::vector<int64_t> a(static_cast<size_t>(n));
        std::iota(a.begin(), a.end(), int64_t(0));
        for (int64_t i = n - 1; i >= 1; --i) {
            auto j = static_cast<int64_t>(random_interval(static_cast<uint64_t>(i)));
            std::swap(a[i], a[j]);
        }
        return a;
    }

private:
    __extension__ typedef unsigned __int128 u128;  // g++ and clang on x86_64 and arm64
    // PCG_DEFAULT_MULTIPLIER_128
    static constexpr u128 kMult = (u128(2549297995355413924ULL) << 64) | 4865540595714422341ULL;

    u128 state_ = 0;
    u128 inc_ = 0;
    bool has_uint32_ = false;
    uint32_t uinteger_ = 0;

    void step() { state_ = state_ * kMult + inc_; }
};

}  // namespace edgefl
