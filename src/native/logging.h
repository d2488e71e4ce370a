// Routing of llama.cpp's log into Python, and capture of error lines for exception messages.
#pragma once

#include <string>
#include <vector>

#include <nanobind/nanobind.h>

namespace llamaspec {

// Offers one finished log line to the innermost LogCapture of this thread.
void capture_line(int level, const std::string & line);

// While alive, collects the WARN/ERROR lines that llama.cpp logs on this thread, so that a failed
// native call can name the problem in its exception. Nests (an inner capture sees only its lines).
class LogCapture {
public:
    LogCapture();
    ~LogCapture();
    LogCapture(const LogCapture &) = delete;
    LogCapture & operator=(const LogCapture &) = delete;

    const std::vector<std::string> & lines() const { return lines_; }
    // The captured error lines joined by "; " (warnings too when there is no error line).
    std::string summary() const;
    bool contains(const std::string & needle) const;

private:
    friend void capture_line(int level, const std::string & line);
    std::vector<std::string> lines_;
    std::vector<int> levels_;
    LogCapture * outer_;
};

void install_log_routing();
void register_logging(nanobind::module_ & m);

}  // namespace llamaspec
