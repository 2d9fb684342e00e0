// Renders a fixed conversation with each of llama.cpp's built-in chat templates (by name),
// as JSON lines: {"name", "with_system", "prompt"} — the reference for minfer's built-ins.
#include "llama.h"
#include <cstdio>
#include <string>
#include <vector>
static std::string esc(const std::string & s) {
    std::string o;
    for (unsigned char c : s) {
        if (c == '"') o += "\\\""; else if (c == '\\') o += "\\\\"; else if (c == '\n') o += "\\n";
        else if (c == '\t') o += "\\t"; else if (c < 0x20) { char b[8]; snprintf(b, 8, "\\u%04x", c); o += b; }
        else o += (char) c;
    }
    return o;
}
int main() {
    const char * names[128];
    int n = llama_chat_builtin_templates(names, 128);
    std::vector<llama_chat_message> with = {
        {"system", "You are a helpful assistant"}, {"user", "Hello"}, {"assistant", "Hi there"},
        {"user", "Who are you"}, {"assistant", "   I am an assistant   "}, {"user", "Another question"},
    };
    std::vector<llama_chat_message> without(with.begin() + 1, with.end());
    for (int i = 0; i < n; i++) {
        for (int sys = 0; sys < 2; sys++) {
            auto & msgs = sys ? with : without;
            std::vector<char> buf(1 << 16);
            int32_t r = llama_chat_apply_template(names[i], msgs.data(), msgs.size(), true, buf.data(), buf.size());
            if (r < 0) { printf("{\"name\": \"%s\", \"with_system\": %s, \"error\": %d}\n", names[i], sys ? "true" : "false", r); continue; }
            printf("{\"name\": \"%s\", \"with_system\": %s, \"prompt\": \"%s\"}\n", names[i], sys ? "true" : "false", esc(std::string(buf.data(), r)).c_str());
        }
    }
}
