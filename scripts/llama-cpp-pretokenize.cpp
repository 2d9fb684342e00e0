// llama.cpp's own view of two things minfer's pre-tokenizers must reproduce, as the references
// for minfer's tests; `scripts/gen-pretokenize-fixtures.sh` builds and runs it against the
// llama.cpp vendored in llama-cpp-python 0.3.36 (commit 0c1e570).
//
// With no argument: the word splits of the `gpt-4o` pre-tokenizer (LLAMA_VOCAB_PRE_TYPE_GPT4O)
// over a fixed corpus (tests/fixtures/tokenizer/pretokenize_gpt4o.jsonl), one JSON line per case,
// `{"text": ..., "words": [byte length of each word, ...]}`. It calls `unicode_regex_split`
// exactly as `llm_tokenizer_bpe_session::tokenize` does: on the raw UTF-8 text, with the
// vocabulary's regex list; `byte_encode` is false only so that the words come back as the
// text's own bytes rather than GPT-2's byte-to-character form (that mapping runs after the
// split and does not move its boundaries). llama.cpp has no scanner of its own for this regex,
// so the split is std::regex's over the category-collapsed text.
//
// With `classes`: the class every code point has in llama.cpp's Unicode tables, as runs
// `FIRST LAST CLASS` in hex (tests/fixtures/tokenizer/unicode_classes.txt). CLASS is W
// (whitespace, which llama.cpp tests first), N, L, M or P (the general categories \p{N}, \p{L},
// \p{M}, \p{P}), O (anything else) or S (the surrogates, which are not characters).

#include "unicode.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

// Copied verbatim from src/llama-vocab.cpp (`case LLAMA_VOCAB_PRE_TYPE_GPT4O:`); the generating
// script checks that the line is still there.
static const char * GPT4O_REGEX =
                    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Hand-written cases: prose, contractions in every case, CamelCase and ALLCAPS, numbers, code,
// whitespace mixtures, paths, and text in several scripts.
static const char * CASES[] = {
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they're right, but we'd better check what you've done; it's late and I'll go.",
    "I'M SURE THEY'RE RIGHT, BUT WE'D BETTER CHECK WHAT YOU'VE DONE; IT'S LATE AND I'LL GO.",
    "DON'T they'Re I'M we'Ll You'D it'S She'S HE'LL you'rE we'VE can't won't shan't",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D 'x 'r 'l",
    "rock'n'roll o'clock y'all ma'am O'Neil D'Artagnan MCDONALD'S McDonald's",
    "It''s 'quoted' \"double\" ''s",
    "CamelCaseWord parseHTTPResponse XMLHttpRequest getURLForID iPhone eBay macOS",
    "ALLCAPS NASA HTTP/2 URL ID IDs PDFs ABCdef abcDEF aBcDeF AbC",
    "snake_case_name SCREAMING_SNAKE_CASE kebab-case-name dot.separated.name",
    "0 1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890",
    "3.14159 -42 +7 1e10 0x1F 0b1010 1,000,000 10:30 2024-06-01 $19.99 50% #1",
    "v1.2.3 x86_64 utf8 H2O CO2 A4 4K 1080p 3rd 21st",
    "fn main() {\n    let x: Vec<u32> = vec![1, 2, 3];\n    println!(\"{:?}\", x);\n}\n",
    "def f(a, b=2):\n\treturn a ** b  # power\n\nprint(f(3))\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "const sum = (xs) => xs.reduce((a, b) => a + b, 0); // JS\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE 'A%';",
    "<div class=\"main\"><p>Hello &amp; welcome</p></div>",
    "if (a && b || !c) { x += 1; y -= 2; z *= 3; w /= 4; } else { return; }",
    "a  b   c    d\te\t\tf\n\ng\r\nh \n i\n\n\n",
    "  leading spaces and trailing spaces   ",
    "\n\nnewlines first",
    " \t \n \r\n  \n\t x",
    "line one\r\nline two\rline three\n",
    "word\n  indented\n    more\n\tand tab",
    "trailing space \n",
    "tabs\t\t\tand\t spaces \t mixed",
    "https://example.com/path/to/page?query=1&b=two#frag",
    "/usr/local/bin/minfer --model ./models/qwen.gguf > out.txt",
    "C:\\Users\\Name\\file.txt and ../relative/path/ and //double//slashes//",
    "a/b/c /x /y/ ./z ../ //\n/\n//\n",
    "...///\n\n/x\r\n/",
    "Café résumé naïve coöperate façade jalapeño Ångström Øre ÉCOLE ÉTÉ Été",
    "ÉA ÉAB ÉAb AÉb aÉB aÉ Éa ÉÉa ÉÉ É's ÉA'S éA ÀÉÎÕÜ àéîõü ÀbÉ",
    "STRASSE straße Straße ĲSSELMEER ĳssel Ǆ ǅ ǆ ǅungla",
    "Γειά σου Κόσμε ΑΘΗΝΑ αθήνα ΑθήναΚαι",
    "Привет мир МОСКВА Москва москваМОСКВА ЁЖИК",
    "中文字符测试 日本語のテキスト 한국어 텍스트 漢字かなカナ",
    "مرحبا بالعالم العربية ١٢٣٤٥ ٠١",
    "नमस्ते दुनिया हिन्दी भाषा क्षत्रिय",
    "বাংলা ভাষা আমার সোনার বাংলা",
    "தமிழ் ಕನ್ನಡ ไทย ภาษาไทย",
    "e\u0301 E\u0301 a\u0308o\u0308 A\u0308O\u0308 x\u0301\u0302y",
    "Emoji 🚀 rocket 👍🏽 thumbs 👨‍👩‍👧 family 🇯🇵 flag ❤️ heart",
    "😀😃😄 abc😀def ABC😀DEF 1😀2",
    "ｆｕｌｌｗｉｄｔｈ ＦＵＬＬ １２３ 、。「」",
    "superscript x² y³ ½ ¼ Ⅻ ⅻ ① ٣",
    "non\u00a0breaking\u00a0space and\u3000ideographic\u3000space and\u2028line\u2029para",
    "nel\u0085here zero\u200bwidth zwj\u200djoin \u2003em\u2003space",
    "modifier ʰʲ letters ª º µ ß ſ Kelvin \u212a",
    "control\x01" "chars\x7f" " and\x0b" "vertical\x0c" "feed",
    "MiXeD cAsE wItH ApOsTrOpHeS'S lIkE tHiS'lL",
    "email@example.com user+tag@mail.co.uk @mention #hashtag",
    "\"Quoted\" (parens) [brackets] {braces} <angles> «guillemets» „low“ ‘single’ “double”",
    "— en–dash … ellipsis · middle • bullet ¿Qué? ¡Hola!",
    "x\n/\n/y\n\n//z",
    "a'\nb'\n's\n'S",
    "0123456789012345678901234567890",
    "ab12cd345ef6789",
    "a1b2c3 A1B2C3 é1É2",
    "", " ", "  ", "\n", "\r\n", "\t", "a", "A", "'", "1", "/", "é", "É",
};

// A small generator so the corpus is the same on every run.
struct Rng {
    uint64_t s;
    uint64_t next() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return s;
    }
};

// The alphabet the random strings are drawn from: ASCII, with letters weighted up, and one or
// two characters of each class and script the rules treat differently.
static const char * ALPHABET[] = {
    "a", "b", "e", "s", "t", "z", "A", "B", "E", "S", "T", "Z", "a", "e", "A", "E",
    "0", "1", "5", "9", " ", " ", " ", " ", "\t", "\n", "\n", "\r", "\x0b", "\x0c",
    "'", "'", "'s", "'S", "'re", "'RE", "'ll", "'Ll", "'d", "'M", "'t", "'ve",
    "/", "/", ".", ",", "!", "?", "-", "_", "(", ")", "\"", ";", ":", "#", "$", "+", "<", "=", "`", "|", "~", "@",
    "é", "É", "ß", "ñ", "Ñ", "Ø", "ǅ", "ʰ", "ª",
    "α", "Ω", "д", "Ж",
    "中", "文", "あ", "カ", "한",
    "ع", "ب", "١",
    "न", "्", "े", "क", "া", "\u0301",
    "🚀", "👍", "\xf0\x9f\x8f\xbd", "\u200d", "\u200b",
    "²", "Ⅻ", "½",
    "\u00a0", "\u3000", "\u2028", "\u0085",
    "Ａ", "ａ", "１", "。", "«", "—",
    "\x01", "\x7f",
};

static std::string json_string(const std::string & s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += (char) c;
        } else if (c < 0x20) {
            char buf[8];
            snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += (char) c;
        }
    }
    return out + "\"";
}

static int print_classes() {
    const auto cls = [](uint32_t c) -> char {
        if (c >= 0xD800 && c < 0xE000) {
            return 'S';
        }
        const auto f = unicode_cpt_flags_from_cpt(c);
        return f.is_whitespace ? 'W' : f.is_number ? 'N' : f.is_letter ? 'L' : f.is_accent_mark ? 'M' : f.is_punctuation ? 'P' : 'O';
    };
    uint32_t start = 0;
    for (uint32_t c = 1; c <= 0x110000; c++) {
        if (c == 0x110000 || cls(c) != cls(start)) {
            printf("%x %x %c\n", start, c - 1, cls(start));
            start = c;
        }
    }
    return 0;
}

int main(int argc, char ** argv) {
    if (argc > 1 && std::string(argv[1]) == "classes") {
        return print_classes();
    }
    std::vector<std::string> corpus;
    for (const char * c : CASES) {
        corpus.push_back(c);
    }
    Rng rng{0x9e3779b97f4a7c15ull};
    const size_t n_alpha = sizeof ALPHABET / sizeof ALPHABET[0];
    for (int i = 0; i < 3000; i++) {
        size_t len = 1 + rng.next() % 20;
        std::string s;
        for (size_t j = 0; j < len; j++) {
            s += ALPHABET[rng.next() % n_alpha];
        }
        corpus.push_back(s);
    }

    const std::vector<std::string> regex = {GPT4O_REGEX};
    for (const auto & text : corpus) {
        const auto words = unicode_regex_split(text, regex, false);
        std::string joined;
        std::string lens;
        for (const auto & w : words) {
            joined += w;
            lens += (lens.empty() ? "" : ",") + std::to_string(w.size());
        }
        if (joined != text) {
            fprintf(stderr, "the words of %s do not give the text back\n", json_string(text).c_str());
            return 1;
        }
        printf("{\"text\":%s,\"words\":[%s]}\n", json_string(text).c_str(), lens.c_str());
    }
    return 0;
}
