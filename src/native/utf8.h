// Incremental UTF-8 validation with the same replacement rule as Python's
// bytes.decode("utf-8", errors="replace"): each maximal invalid subpart becomes one U+FFFD.
// Streaming with this decoder and decoding the joined bytes in Python give the same text.
#pragma once

#include <string>

namespace llamaspec {

class Utf8Decoder {
public:
    // Appends bytes and returns the text that is now complete. With final=true an incomplete tail is
    // replaced too (as Python does at the end of input); otherwise it is held back.
    std::string feed(const std::string & bytes, bool final = false) {
        pending_ += bytes;
        std::string out;
        out.reserve(pending_.size());
        size_t i = 0;
        const size_t n = pending_.size();
        while (i < n) {
            const unsigned char c = (unsigned char) pending_[i];
            if (c < 0x80) {
                out += (char) c;
                ++i;
                continue;
            }
            size_t need;
            unsigned char lo = 0x80, hi = 0xBF;  // valid range of the second byte
            if (c >= 0xC2 && c <= 0xDF) {
                need = 1;
            } else if (c >= 0xE0 && c <= 0xEF) {
                need = 2;
                if (c == 0xE0) lo = 0xA0;
                if (c == 0xED) hi = 0x9F;
            } else if (c >= 0xF0 && c <= 0xF4) {
                need = 3;
                if (c == 0xF0) lo = 0x90;
                if (c == 0xF4) hi = 0x8F;
            } else {
                out += kReplacement;  // invalid start byte
                ++i;
                continue;
            }
            size_t j = i + 1;
            bool bad = false;
            for (size_t k = 0; k < need; ++k, ++j) {
                if (j >= n) break;  // incomplete so far
                const unsigned char b = (unsigned char) pending_[j];
                const unsigned char l = k == 0 ? lo : 0x80;
                const unsigned char h = k == 0 ? hi : 0xBF;
                if (b < l || b > h) {
                    bad = true;
                    break;
                }
            }
            if (bad) {
                out += kReplacement;  // the maximal valid prefix [i, j) is one error
                i = j;
                continue;
            }
            if (j - i < need + 1) {  // ran out of input in a sequence that is valid so far
                if (final) {
                    out += kReplacement;
                    i = n;
                    break;
                }
                break;
            }
            out.append(pending_, i, j - i);
            i = j;
        }
        pending_.erase(0, i);
        return out;
    }

    bool has_pending() const { return !pending_.empty(); }
    void reset() { pending_.clear(); }

private:
    static constexpr const char * kReplacement = "\xEF\xBF\xBD";
    std::string pending_;
};

}  // namespace llamaspec
