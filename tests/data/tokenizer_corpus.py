"""Strings the tokenizers are checked on against llama.cpp (tests/test_tokenizer.py).

Each line is here for an edge case llama.cpp's tokenizers treat specially: leading and
trailing spaces, whitespace runs (Gemma has tokens for space and newline runs), digits
(split one by one or three by three depending on the pre-tokenizer), contractions, byte
fallback for characters outside the vocabulary, combining marks, emoji sequences, scripts
without spaces, code, and special-token text typed into the prompt.
"""

LONG_PARAGRAPH = (
    "The history of natural language processing generally started in the 1950s, although work can be "
    "found from earlier periods. In 1950, Alan Turing published an article titled \"Computing Machinery and "
    "Intelligence\" which proposed what is now called the Turing test as a criterion of intelligence. The "
    "Georgetown experiment in 1954 involved fully automatic translation of more than sixty Russian sentences "
    "into English. The authors claimed that within three or five years, machine translation would be a solved "
    "problem.  However, real progress was much slower, and after the ALPAC report in 1966, which found that "
    "ten-year-long research had failed to fulfill the expectations, funding for machine translation was "
    "dramatically reduced.\n\nLittle further research in machine translation was conducted until the late "
    "1980s when the first statistical machine translation systems were developed. Some notably successful "
    "natural language processing systems developed in the 1960s were SHRDLU, a natural language system "
    "working in restricted \"blocks worlds\" with restricted vocabularies, and ELIZA, a simulation of a "
    "Rogerian psychotherapist, written by Joseph Weizenbaum between 1964 and 1966. Using almost no "
    "information about human thought or emotion, ELIZA sometimes provided a startlingly human-like "
    "interaction. When the \"patient\" exceeded the very small knowledge base, ELIZA might provide a generic "
    "response, for example, responding to \"My head hurts\" with \"Why do you say your head hurts?\"."
)

PYTHON_CODE = '''def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    seq = [0, 1]
    while len(seq) < n:
        seq.append(seq[-1] + seq[-2])  # next = a + b
    return seq[:n]


if __name__ == "__main__":
\tfor i, x in enumerate(fibonacci(10)):
\t\tprint(f"{i:>3}: {x}")
'''

C_CODE = "int main(void) {\n\tint x = 0x1F;\n\tfor (int i = 0; i < 10; ++i) { x <<= 1; }\n\treturn x != 42 ? -1 : 0;\n}\n"

CORPUS = [
    # empty, blanks and whitespace runs
    "",
    " ",
    "  ",
    "   ",
    "\n",
    "\t",
    "\r\n",
    "\n\n\n\n",
    " \n \n ",
    "Hello world",
    " Hello world",
    "  Hello  world  ",
    "Hello world ",
    "a  b   c    d     e",
    "word" + " " * 40 + "word",
    "tabs\t\tand\t\t\ttabs",
    "line one\nline two\r\nline three\n\n\nline six",
    "   \n  \n\t\n",
    # accents, combining marks, case
    "Héllo wörld, ça va? naïve café résumé",
    "e\u0301 combining acute, A\u030a ring",
    "ÀÉÎÕÜ àéîõü ÆØÅ æøå ß ẞ",
    "I'm you're he's we'll they'd I've don't",
    "I'M YOU'RE HE'S WE'LL THEY'D I'VE DON'T",
    "'s 'S 't 'll 're",
    # numbers
    "1",
    "12",
    "123",
    "1234",
    "12345",
    "1234567890",
    "12345678901234567890123456789012345678901234567890",
    "3.14159 2.71828 -0.5 +7 1e-10",
    "1,000,000 and 1 000 000",
    "2024-01-31T12:34:56Z",
    "٠١٢٣٤٥٦٧٨٩ ½ ² ³ Ⅻ ①",
    "phone: +1 (555) 123-4567",
    # emoji, incl. modifiers and ZWJ sequences
    "🤖",
    "Héllo 🤖 <start_of_turn>",
    "👍🏽 👋🏿",
    "👩‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️",
    "🇫🇷🇯🇵🇺🇸",
    "😀😃😄😁😆😅🤣😂",
    "emoji🤖inside🤖words",
    # other scripts
    "日本語のテキストです。東京は大きい都市です。",
    "中文文本处理很有意思，我们来测试一下。",
    "한국어 텍스트를 토큰화합니다.",
    "English中文日本語한국어mixed",
    "مرحبا بالعالم، كيف حالك؟",
    "שלום עולם",
    "नमस्ते दुनिया, यह एक परीक्षण है।",
    "สวัสดีชาวโลก",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "𝕳𝖊𝖑𝖑𝖔 𐍈 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    # code and markup
    PYTHON_CODE,
    C_CODE,
    '{"key": [1, 2.5, null, true], "nested": {"a": "b\\n"}}',
    "<table><tr><td>cell</td></tr></table>",
    "<h1>Title</h1>\n<p>Some <b>bold</b> text.</p>",
    "# Heading\n\n- item one\n- item two\n\n```python\nprint('hi')\n```",
    "https://example.com/path?query=1&x=y#frag user@example.org",
    "∀x∈ℝ: x²≥0 → ∑ᵢ aᵢ ≤ ∞",
    "!!!???... — … «quotes» “curly” ‘single’",
    "$100 + 50% = <>^~|` \\ @#&*",
    "a ~b ~~ ~ x~y ^_^ `tick` |pipe|",
    # unusual characters
    "zero\u200bwidth\u200cjoiner\u200d",
    "no\u00a0break\u3000ideographic\u2028line\u2029para",
    "\x00\x01\x1f\x7f controls",
    "\ufeffBOM at start",
    "replacement \ufffd char",
    "▁ already marked ▁▁",
    "Ġ Ċ ĉ byte-alphabet letters",
    "<0x41> looks like a byte token",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    # characters newer than llama.cpp's Unicode 15.1 tables (there: no category): Garay digit zero and
    # letter (16.0), a currency sign and a Balinese punctuation mark (16.0)
    "  \U00010D40",
    "\U00010D50's",
    " \u20C1",
    " \u1B4E",
    # special-token text
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_start|>",
    " <|im_end|> ",
    "<|im_start",
    "<|endoftext|>",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn",
    "<<start_of_turn>>",
    "<bos>",
    "<bos>Hello",
    "<eos>",
    "</s>",
    "<pad><unk><mask>",
    "<unused5> [multimodal]",
    "<repo_name>memra<file_sep>x.py",
    "text<end_of_turn>",
    # a long paragraph
    LONG_PARAGRAPH,
]
